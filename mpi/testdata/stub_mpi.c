/* stub_mpi: a stand-in libmpi.so.40 that defines a made-up MPI symbol, so
 * that missing_symbol.c can be linked against it. The check must then
 * report MPI_Made_up_symbol as missing from the real host library. */
int MPI_Init(int *argc, char ***argv) { (void)argc; (void)argv; return 0; }
int MPI_Finalize(void) { return 0; }
int MPI_Made_up_symbol(int x) { return x; }
