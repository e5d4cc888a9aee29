// Command manpage writes spank-microvm(8), the manual page of the SPANK
// plugin's options (srun/sbatch/salloc --microvm and --microvm-*) and of
// its plugstack.conf arguments, from the plugin's own option table in
// spank/args.c: the table Slurm prints under "[microvm]" in `srun --help`.
//
//	go run ./spank/manpage -args spank/args.c -o bin/man/spank-microvm.8
//
// `make man` runs it; the page is a build output (bin/man), shipped by the
// Debian package (hack/mkdeb) as /usr/share/man/man8/spank-microvm.8.gz.
//
// Design decisions (the alternative, and why not):
//
//   - The page is generated from args.c's mv_spank_options initialisers,
//     parsed here (name, arginfo, the concatenated usage literals), so
//     the C table stays the one source of both --help and the page.
//     Rejected: a shared table file (JSON or an X-macro header) that both
//     the C code and this generator read. It would add a generated C
//     source to the plugin's hardened build for six entries; a parse that
//     fails loudly on a table it does not understand (Parse checks every
//     MV_OPT_ enum value has its entry) gives the same guarantee.
//     Rejected too: loading the built plugin through the spank harness's
//     fake Slurm to read the registered options: that needs cgo and the
//     plugin built, for text that is all in the source.
//   - Not committed: a committed page would go stale with the next option;
//     TestPageListsEveryOption checks the rendered page against args.c.
package main
