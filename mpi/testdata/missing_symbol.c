/* missing_symbol: a program importing an MPI symbol that no real MPI
 * library defines (linked against stub_mpi.c built as libmpi.so.40). */
int MPI_Init(int *argc, char ***argv);
int MPI_Finalize(void);
int MPI_Made_up_symbol(int x);

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int r = MPI_Made_up_symbol(argc - 1);
	MPI_Finalize();
	return r;
}
