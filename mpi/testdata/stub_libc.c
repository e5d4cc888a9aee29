/* stub_libc: a libc.so.6 whose only symbol version is GLIBC_2.2.5 (the
 * x86-64 baseline), standing in for a very old glibc in an image: every
 * newer GLIBC_x.y the host libraries need is missing from it. Built with
 * stub_libc.map as its version script. */
int stub_libc_marker(void) { return 0; }
