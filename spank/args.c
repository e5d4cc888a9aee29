/*
 * args.c - plugstack.conf arguments and the --microvm* options.
 *
 * plugstack.conf arguments (all optional, paths absolute; etc/plugstack.conf
 * lists the same ones, a harness test loads the plugin with them):
 *   launcher=PATH  slurm-microvm   (default /usr/local/bin/slurm-microvm)
 *   exec=PATH      exec entry      (default <launcher>-exec)
 *   config=PATH    --config        (default /etc/slurm/microvm.toml)
 *   timeout=SECS   bound of every synchronous launcher call (default 300)
 * Anything else is refused with its name, so a typo never goes unnoticed.
 * The runtime directory is microvm.toml's runtime_dir, not an argument.
 *
 * Options are registered with spank_option_register() in every context
 * (sbatch/salloc ignore a static spank_options table). Their callbacks copy
 * the value; the value itself is judged by the launcher (`slurm-microvm
 * validate`), not here. Two rules are the plugin's own, as in pyxis:
 *   - one option, one value: Slurm may call a callback twice with the same
 *     value (job options, then the environment), which is accepted; a
 *     second, different value is refused, naming both;
 *   - a --microvm-* option without --microvm=IMAGE is refused
 *     (mv_options_orphan): without an image the step would run on the host
 *     and the option would silently do nothing.
 * Every option has an environment fallback, SLURM_MICROVM_<NAME> as pyxis
 * has PYXIS_* (mv_options_env): used when the option is not given, read
 * from srun's/sbatch's environment and, on the node, from the step's
 * (which srun exports); the command line wins. The variables other than
 * SLURM_MICROVM_IMAGE count only for a step with an image (from either).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "microvm.h"

enum {
	MV_OPT_IMAGE = 1,
	MV_OPT_DEBUG,
	MV_OPT_MOUNTS,
	MV_OPT_WORKDIR,
	MV_OPT_MPI,
	MV_OPT_NETWORK,
};

static int mv_option_cb(int val, const char *optarg, int remote);

/*
 * Accepted forms of each value (arginfo) and one "[microvm]" heading on
 * every line, as Slurm's --help lists all plugins' options together. The
 * MPI modes are launcher.MPIModes (a harness test compares them).
 */
static struct spank_option mv_spank_options[] = {
	{ "microvm", "[docker://]REGISTRY/IMAGE[:TAG]|PATH",
	  "[microvm] run the step's tasks inside a microVM booted from this "
	  "image (one VM per step per node). PATH: an OCI archive or layout, "
	  "a squashfs file or a root directory, absolute or ./relative "
	  "(env SLURM_MICROVM_IMAGE)",
	  1, MV_OPT_IMAGE, mv_option_cb },
	{ "microvm-debug", NULL,
	  "[microvm] verbose launcher logs and the guest console on the "
	  "stderr of local task 0 (needs --microvm; env SLURM_MICROVM_DEBUG=1)",
	  0, MV_OPT_DEBUG, mv_option_cb },
	{ "microvm-mounts", "SRC[:DST[:FLAGS]],...",
	  "[microvm] host directories in the guest (needs --microvm). DST "
	  "defaults to SRC; FLAGS ro (default), rw, optional, joined with +; "
	  "escape , : \\ in paths as \\, \\: \\\\ (env SLURM_MICROVM_MOUNTS)",
	  1, MV_OPT_MOUNTS, mv_option_cb },
	{ "microvm-workdir", "DIR",
	  "[microvm] working directory of the tasks in the guest, absolute "
	  "(needs --microvm; default: the image's WORKDIR, else /; env "
	  "SLURM_MICROVM_WORKDIR)",
	  1, MV_OPT_WORKDIR, mv_option_cb },
	{ "microvm-mpi", "auto|host|image|off",
	  "[microvm] the host's MPI in the guest: when the ABIs match (auto, "
	  "the default), always (host), never (image, off) (needs --microvm; "
	  "env SLURM_MICROVM_MPI)",
	  1, MV_OPT_MPI, mv_option_cb },
	{ "microvm-network", "none|step|user",
	  "[microvm] the guest's network: none, the step's own network "
	  "across its nodes (step), or outbound NAT (user); the site "
	  "decides which are allowed (needs --microvm; env "
	  "SLURM_MICROVM_NETWORK)",
	  1, MV_OPT_NETWORK, mv_option_cb },
	SPANK_OPTIONS_TABLE_END
};

int mv_options_register(spank_t sp)
{
	struct spank_option *o;

	for (o = mv_spank_options; o->name; o++) {
		spank_err_t rc = spank_option_register(sp, o);

		if (rc != ESPANK_SUCCESS) {
			mv_error("cannot register option --%s: %s", o->name,
				 spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

static const char *mv_option_name(int val)
{
	struct spank_option *o;

	for (o = mv_spank_options; o->name; o++)
		if (o->val == val)
			return o->name;
	return "?";
}

/* Replaces *dst by a copy of src; the old value is freed. */
static int mv_set_string(char **dst, const char *src)
{
	char *copy = strdup(src);

	if (!copy)
		return -1;
	free(*dst);
	*dst = copy;
	return 0;
}

/*
 * Sets option val to optarg; src names where the value came from in
 * errors ("--microvm-mounts", or the environment variable).
 */
static int mv_option_set(int val, const char *optarg, const char *src)
{
	const char *name = mv_option_name(val);
	char **dst = NULL;

	switch (val) {
	case MV_OPT_DEBUG:
		mv.opt.debug = 1;
		return 0;
	case MV_OPT_IMAGE:
		dst = &mv.opt.image;
		break;
	case MV_OPT_MOUNTS:
		dst = &mv.opt.mounts;
		break;
	case MV_OPT_WORKDIR:
		dst = &mv.opt.workdir;
		break;
	case MV_OPT_NETWORK:
		dst = &mv.opt.network;
		break;
	case MV_OPT_MPI:
		dst = &mv.opt.mpi;
		break;
	default:
		mv_error("unknown option value %d", val);
		return -1;
	}

	if (!optarg || !optarg[0]) {
		mv_error("%s: the value must not be empty (use --%s=%s)",
			 src, name, val == MV_OPT_IMAGE ? "IMAGE" : "VALUE");
		return -1;
	}
	if (strlen(optarg) > MV_MAX_OPTARG) {
		mv_error("%s: the value is longer than %d bytes", src,
			 MV_MAX_OPTARG);
		return -1;
	}
	for (const char *c = optarg; *c; c++) {
		/* Names and paths never hold them, and a newline or an
		 * escape sequence in a value would reach admins' terminals
		 * (`slurm-microvm ps`) and logs as if it were theirs. */
		if ((unsigned char)*c < 0x20 || *c == 0x7f) {
			mv_error("%s: the value holds a control character (byte "
				 "0x%02x at offset %d): images, paths and modes "
				 "are printable text", src, (unsigned char)*c,
				 (int)(c - optarg));
			return -1;
		}
	}
	if (*dst) {
		/* Slurm replays options: the same value again is no news. */
		if (!strcmp(*dst, optarg))
			return 0;
		mv_error("--%s is given twice with different values (\"%s\", "
			 "then \"%s\"): give it once", name, *dst, optarg);
		return -1;
	}
	if (mv_set_string(dst, optarg) < 0) {
		mv_error("%s: out of memory", src);
		return -1;
	}
	return 0;
}

static int mv_option_cb(int val, const char *optarg, int remote)
{
	char src[64];

	(void)remote;
	snprintf(src, sizeof(src), "--%s", mv_option_name(val));
	return mv_option_set(val, optarg, src);
}

/*
 * Environment fallbacks, as pyxis has PYXIS_*: the variable of an option
 * that the command line (or #SBATCH) did not give. Empty means unset.
 * SLURM_MICROVM_MOUNTS is not here: the launcher reads it itself (validate
 * from srun's environment, prepare through --mounts-env), so that its
 * errors name the variable and the mount policy knows its origin.
 */
static const struct {
	int val;
	const char *var;
} mv_env_options[] = {
	{ MV_OPT_IMAGE, "SLURM_MICROVM_IMAGE" }, /* first: see mv_options_env */
	{ MV_OPT_WORKDIR, "SLURM_MICROVM_WORKDIR" },
	{ MV_OPT_MPI, "SLURM_MICROVM_MPI" },
	{ MV_OPT_NETWORK, "SLURM_MICROVM_NETWORK" },
	{ MV_OPT_DEBUG, "SLURM_MICROVM_DEBUG" },
	{ 0, NULL },
};

static int mv_option_given(int val)
{
	switch (val) {
	case MV_OPT_DEBUG:
		return mv.opt.debug;
	case MV_OPT_IMAGE:
		return mv.opt.image != NULL;
	case MV_OPT_MOUNTS:
		return mv.opt.mounts != NULL;
	case MV_OPT_WORKDIR:
		return mv.opt.workdir != NULL;
	case MV_OPT_MPI:
		return mv.opt.mpi != NULL;
	case MV_OPT_NETWORK:
		return mv.opt.network != NULL;
	}
	return 0;
}

/* Adds var to mv.opt.from_env (", "-joined, each name once, bounded). */
static void mv_note_env(const char *var)
{
	char *f = mv.opt.from_env;
	size_t n = strlen(f);

	if (strstr(f, var))
		return;
	snprintf(f + n, sizeof(mv.opt.from_env) - n, "%s%s", n ? ", " : "",
		 var);
}

/* SLURM_MICROVM_DEBUG: 1/yes/true/on set it, 0/no/false/off do not. */
static int mv_env_debug(const char *var, const char *v)
{
	static const char *on[] = { "1", "yes", "true", "on", NULL };
	static const char *off[] = { "0", "no", "false", "off", NULL };
	int i;

	for (i = 0; on[i]; i++)
		if (!strcasecmp(v, on[i])) {
			mv.opt.debug = 1;
			return 0;
		}
	for (i = 0; off[i]; i++)
		if (!strcasecmp(v, off[i]))
			return 0;
	mv_error("%s=%s: want 1 or 0 (also yes/no, true/false, on/off)", var,
		 v);
	return -1;
}

int mv_options_env(spank_t sp, int remote)
{
	char buf[MV_MAX_OPTARG + 2];
	const char *v;
	int i;

	for (i = 0; mv_env_options[i].var; i++) {
		const char *var = mv_env_options[i].var;

		/* Without an image the other variables are not orphans, as
		 * --microvm-* would be: a profile that sets them must not
		 * break every host step. */
		if (mv_env_options[i].val != MV_OPT_IMAGE && !mv.opt.image)
			return 0;
		if (mv_option_given(mv_env_options[i].val))
			continue;
		if (remote) {
			spank_err_t err = spank_getenv(sp, var, buf,
						       sizeof(buf));

			if (err == ESPANK_ENV_NOEXIST)
				continue;
			if (err == ESPANK_NOSPACE) {
				mv_error("%s: the value is longer than %d bytes",
					 var, MV_MAX_OPTARG);
				return -1;
			}
			if (err != ESPANK_SUCCESS) {
				mv_error("cannot read %s of the job: %s", var,
					 spank_strerror(err));
				return -1;
			}
			v = buf;
		} else if (!(v = getenv(var))) {
			continue;
		}
		if (!v[0])
			continue;
		if (mv_env_options[i].val == MV_OPT_DEBUG) {
			if (mv_env_debug(var, v) < 0)
				return -1;
		} else if (mv_option_set(mv_env_options[i].val, v, var) < 0) {
			return -1;
		}
		/* Only what took effect, once: Slurm calls init_post_opt once
		 * per component of a heterogeneous job, and an "off" debug
		 * value sets nothing, so it is read again each time. */
		if (mv_option_given(mv_env_options[i].val))
			mv_note_env(var);
	}
	return 0;
}

char *mv_options_orphan(void)
{
	char given[128] = "", *msg = NULL;
	int n = 0;

	if (mv.opt.image)
		return NULL;
#define MV_ORPHAN(set, opt)                                                  \
	do {                                                                 \
		if (set) {                                                   \
			strcat(given, n++ ? ", " opt : opt);                 \
		}                                                            \
	} while (0)
	MV_ORPHAN(mv.opt.debug, "--microvm-debug");
	MV_ORPHAN(mv.opt.mounts, "--microvm-mounts");
	MV_ORPHAN(mv.opt.workdir, "--microvm-workdir");
	MV_ORPHAN(mv.opt.mpi, "--microvm-mpi");
	MV_ORPHAN(mv.opt.network, "--microvm-network");
#undef MV_ORPHAN
	if (!n)
		return NULL;
	if (asprintf(&msg, "%s %s --microvm=IMAGE: without an image the step "
		     "would run on the host, not in a microVM; add "
		     "--microvm=IMAGE or drop %s", given,
		     n > 1 ? "need" : "needs", given) < 0)
		return NULL;
	return msg;
}

/* Checks one path argument of plugstack.conf: present and absolute. */
static int mv_config_path(const char *key, const char *value, char **dst)
{
	if (*dst) {
		mv_error("plugstack.conf: %s= is given twice", key);
		return -1;
	}
	if (!value[0]) {
		mv_error("plugstack.conf: %s= needs a value", key);
		return -1;
	}
	if (value[0] != '/') {
		mv_error("plugstack.conf: %s=%s must be an absolute path", key,
			 value);
		return -1;
	}
	if (mv_set_string(dst, value) < 0) {
		mv_error("plugstack.conf: %s=: out of memory", key);
		return -1;
	}
	return 0;
}

static int mv_config_timeout(const char *value, unsigned *dst, int *seen)
{
	char *end = NULL;
	unsigned long n;

	if (*seen) {
		mv_error("plugstack.conf: timeout= is given twice");
		return -1;
	}
	*seen = 1;
	errno = 0;
	n = strtoul(value, &end, 10);
	if (!value[0] || !isdigit((unsigned char)value[0]) || *end ||
	    errno || n < 1 || n > MV_MAX_TIMEOUT_S) {
		mv_error("plugstack.conf: timeout=%s must be a whole number of "
			 "seconds from 1 to %u", value, MV_MAX_TIMEOUT_S);
		return -1;
	}
	*dst = (unsigned)n;
	return 0;
}

static int mv_config_parse(int ac, char **av, struct mv_config *c)
{
	int i, timeout_seen = 0;

	c->timeout_s = MV_DEFAULT_TIMEOUT_S;
	for (i = 0; i < ac; i++) {
		const char *arg = av[i];
		const char *eq = strchr(arg, '=');
		size_t klen = eq ? (size_t)(eq - arg) : 0;
		int rc;

#define MV_KEY(k) (eq && klen == sizeof(k) - 1 && !strncmp(arg, k, klen))
		if (MV_KEY("launcher"))
			rc = mv_config_path("launcher", eq + 1, &c->launcher);
		else if (MV_KEY("exec"))
			rc = mv_config_path("exec", eq + 1, &c->exec);
		else if (MV_KEY("config"))
			rc = mv_config_path("config", eq + 1, &c->config);
		else if (MV_KEY("timeout"))
			rc = mv_config_timeout(eq + 1, &c->timeout_s,
					       &timeout_seen);
		else {
			mv_error("plugstack.conf: unknown argument \"%s\" "
				 "(known: launcher=, exec=, config=, timeout=)", arg);
			rc = -1;
		}
#undef MV_KEY
		if (rc < 0)
			return -1;
	}

	if (!c->launcher && mv_set_string(&c->launcher,
					  MV_DEFAULT_LAUNCHER) < 0)
		return -1;
	if (!c->exec) {
		size_t n = strlen(c->launcher) + sizeof(MV_EXEC_SUFFIX);

		if (!(c->exec = malloc(n)))
			return -1;
		strcpy(c->exec, c->launcher);
		strcat(c->exec, MV_EXEC_SUFFIX);
	}
	if (!c->config && mv_set_string(&c->config, MV_DEFAULT_CONFIG) < 0)
		return -1;
	return 0;
}

int mv_config_load(int ac, char **av)
{
	struct mv_config c;

	if (mv.cfg.loaded)
		return 0;
	memset(&c, 0, sizeof(c));
	if (mv_config_parse(ac, av, &c) < 0) {
		free(c.launcher);
		free(c.exec);
		free(c.config);
		return -1;
	}
	c.loaded = 1;
	mv.cfg = c;
	return 0;
}

/*
 * Rank specification of a --multi-prog line: digits, ranges, lists or '*'
 * (Slurm's multi_prog.c), with at least one digit or '*'.
 */
static int mv_is_rank_spec(const char *p, const char *end)
{
	int seen = 0;

	if (p == end)
		return 0;
	for (; p < end; p++) {
		if (isdigit((unsigned char)*p) || *p == '*')
			seen = 1;
		else if (*p != ',' && *p != '-')
			return 0;
	}
	return seen;
}

/*
 * Is this the job argv of a `srun --multi-prog` step? With --multi-prog,
 * srun sends argv = { config file, config file contents, ... } and
 * slurmstepd builds each task's argv from the contents, so an argv[0] swap
 * would never reach the task. The contents are recognised by their shape
 * (Slurm 22.05 src/slurmd/slurmstepd/multi_prog.c): newline-separated lines,
 * '#' comments and blank lines ignored, a trailing '\' continues a line,
 * every other line "RANKS EXECUTABLE [ARGS]".
 */
int mv_is_multi_prog_data(int argc, char **argv)
{
	const char *p;
	int lines = 0, continued = 0;

	if (argc < 2 || !argv || !argv[0] || !argv[1])
		return 0;
	p = argv[1];
	if (!strchr(p, '\n'))
		return 0;

	while (*p) {
		const char *eol = strchr(p, '\n');
		const char *end = eol ? eol : p + strlen(p);
		int continues = end > p && end[-1] == '\\';

		if (!continued) {
			const char *q = p, *r;

			while (q < end && isspace((unsigned char)*q))
				q++;
			if (q < end && *q != '#') {
				r = q;
				while (r < end && !isspace((unsigned char)*r))
					r++;
				if (!mv_is_rank_spec(q, r))
					return 0;
				while (r < end && isspace((unsigned char)*r))
					r++;
				if (r == end)
					return 0;
				lines++;
			}
		}
		continued = continues;
		if (!eol)
			break;
		p = eol + 1;
	}
	return lines > 0;
}

void mv_argv_options(struct mv_argv *a)
{
	if (mv.opt.debug)
		mv_argv_add(a, "--debug");
	if (mv.opt.mounts) {
		mv_argv_add(a, "--mounts");
		mv_argv_add(a, mv.opt.mounts);
	}
	if (mv.opt.workdir) {
		mv_argv_add(a, "--workdir");
		mv_argv_add(a, mv.opt.workdir);
	}
	if (mv.opt.mpi) {
		mv_argv_add(a, "--mpi");
		mv_argv_add(a, mv.opt.mpi);
	}
	if (mv.opt.network) {
		mv_argv_add(a, "--network");
		mv_argv_add(a, mv.opt.network);
	}
}
