# dirs.mk — where `make install` puts things: the one definition, included
# by the top-level Makefile and by spank/Makefile. etc/plugstack.conf, the
# plugin's built-in defaults (spank/microvm.h) and spank/README.md name the
# same paths (spank/harness TestInstallPathsAgree).
#
# SPANKDIR is Slurm's PluginDir on Debian/Ubuntu (slurm-wlm packages).
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBEXECDIR ?= $(PREFIX)/libexec/slurm-microvm
SPANKDIR   ?= /usr/lib/x86_64-linux-gnu/slurm-wlm
SYSCONFDIR ?= /etc/slurm
DESTDIR    ?=
