/* stub_ompi_nodata: a stand-in Open MPI libmpi.so.40 that defines every
 * MPI function mpi_hello.c calls and the predefined handles it takes,
 * except ompi_mpi_op_sum (MPI_SUM) unless WITH_OP_SUM is defined. A program
 * built by the real mpicc takes the handles through R_X86_64_COPY
 * relocations, so they look defined in its own dynamic symbol table; the
 * check must still find MPI_SUM missing from this library.
 * ompi_mpi_comm_world has Open MPI's size (512 bytes on Debian 12, x86-64)
 * unless COMM_WORLD_SIZE says otherwise. */
#ifndef COMM_WORLD_SIZE
#define COMM_WORLD_SIZE 512
#endif
char ompi_version_string[] = "4.1.4";
char ompi_mpi_comm_world[COMM_WORLD_SIZE];
#ifdef WITH_OP_SUM
char ompi_mpi_op_sum[2048];
#endif
char ompi_mpi_int[512];
char ompi_mpi_byte[512];
int MPI_Init(int *argc, char ***argv) { (void)argc; (void)argv; return 0; }
int MPI_Finalize(void) { return 0; }
int MPI_Abort(void *comm, int code) { (void)comm; return code; }
int MPI_Allreduce(const void *s, void *r, int n, void *t, void *op, void *c) { (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; return 0; }
int MPI_Barrier(void *c) { (void)c; return 0; }
int MPI_Comm_rank(void *c, int *r) { (void)c; *r = 0; return 0; }
int MPI_Comm_size(void *c, int *n) { (void)c; *n = 1; return 0; }
int MPI_Get_library_version(char *v, int *n) { v[0] = 0; *n = 0; return 0; }
int MPI_Recv(void *b, int n, void *t, int s, int g, void *c, void *st) { (void)b; (void)n; (void)t; (void)s; (void)g; (void)c; (void)st; return 0; }
int MPI_Send(const void *b, int n, void *t, int d, int g, void *c) { (void)b; (void)n; (void)t; (void)d; (void)g; (void)c; return 0; }
double MPI_Wtime(void) { return 0; }
int MPI_Reduce(const void *s, void *r, int n, void *t, void *op, int root, void *c) { (void)s; (void)r; (void)n; (void)t; (void)op; (void)root; (void)c; return 0; }
int MPI_Sendrecv(const void *sb, int sn, void *st, int d, int sg, void *rb, int rn, void *rt, int s, int rg, void *c, void *status) { (void)sb; (void)sn; (void)st; (void)d; (void)sg; (void)rb; (void)rn; (void)rt; (void)s; (void)rg; (void)c; (void)status; return 0; }
