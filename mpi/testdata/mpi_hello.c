/*
 * mpi_hello: the MPI test program of slurm-microvm (hello + allreduce +
 * ping-pong timer). Built at test time with each implementation's mpicc
 * (see package mpi/mpitest); source of truth for the output format that
 * mpitest.ParseHello reads:
 *
 *   rank R of N
 *   rank R libmpi PATH            (the file the loader mapped for MPI_Init)
 *   rank R host HOSTNAME
 *   library FIRST-LINE            (rank 0: MPI_Get_library_version)
 *   allreduce sum S expected E    (rank 0: sum over ranks of rank+1)
 *   pairs checked C bad B         (rank 0: every rank sent a 64 KiB
 *                                  pattern to every other rank, which
 *                                  checked it: C = N*(N-1) transfers)
 *   pingpong latency_us L bytes B iters I      (rank 0, N >= 2)
 *   pingpong bandwidth_MBps W bytes B iters I  (rank 0, N >= 2)
 *   done
 *
 * Usage: mpi_hello [latency_iters [bandwidth_iters [bandwidth_bytes]]]
 * (defaults 1000, 50, 1048576). Latency is half the round trip of an
 * 8-byte message between ranks 0 and 1; bandwidth is bytes moved one way
 * per second (MB = 10^6 bytes), from round trips of the large message.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* libmpi_path finds the file that holds MPI_Init: dladdr on the address
 * the loader resolved, else the first mapping whose path names an MPI
 * library in /proc/self/maps. */
static void libmpi_path(char *out, size_t n)
{
	Dl_info info;
	void *sym = dlsym(RTLD_DEFAULT, "MPI_Init");
	snprintf(out, n, "unknown");
	if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL && strstr(info.dli_fname, "libmpi") != NULL) {
		snprintf(out, n, "%s", info.dli_fname);
		return;
	}
	FILE *f = fopen("/proc/self/maps", "r");
	if (f == NULL)
		return;
	char line[4096];
	while (fgets(line, sizeof line, f) != NULL) {
		char *p = strchr(line, '/');
		if (p == NULL || strstr(p, "/libmpi") == NULL)
			continue;
		p[strcspn(p, "\n")] = 0;
		snprintf(out, n, "%s", p);
		break;
	}
	fclose(f);
}

int main(int argc, char **argv)
{
	int rank, size;
	long lat_iters = argc > 1 ? atol(argv[1]) : 1000;
	long bw_iters = argc > 2 ? atol(argv[2]) : 50;
	long bw_bytes = argc > 3 ? atol(argv[3]) : 1048576;
	char path[4096], host[256];

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	libmpi_path(path, sizeof path);
	if (gethostname(host, sizeof host) != 0)
		snprintf(host, sizeof host, "unknown");
	printf("rank %d of %d\n", rank, size);
	printf("rank %d libmpi %s\n", rank, path);
	printf("rank %d host %s\n", rank, host);
	fflush(stdout);

	if (rank == 0) {
		char lib[MPI_MAX_LIBRARY_VERSION_STRING];
		int len = 0;
		MPI_Get_library_version(lib, &len);
		lib[strcspn(lib, "\n")] = 0;
		printf("library %s\n", lib);
	}

	int mine = rank + 1, sum = 0;
	MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("allreduce sum %d expected %d\n", sum, size * (size + 1) / 2);

	/* Every ordered pair: in round r each rank sends to rank+r and
	 * receives from rank-r a buffer whose bytes name sender, receiver and
	 * offset, and checks what arrived. */
	{
		enum { PAIR_BYTES = 65536 };
		unsigned char *out = malloc(PAIR_BYTES), *in = malloc(PAIR_BYTES);
		int bad = 0, checked = 0, tbad = 0, tchecked = 0;
		if (out == NULL || in == NULL)
			MPI_Abort(MPI_COMM_WORLD, 2);
		for (int r = 1; r < size; r++) {
			int to = (rank + r) % size, from = (rank - r + size) % size;
			for (int k = 0; k < PAIR_BYTES; k++)
				out[k] = (unsigned char)(rank * 31 + to * 7 + k);
			memset(in, 0, PAIR_BYTES);
			MPI_Sendrecv(out, PAIR_BYTES, MPI_BYTE, to, 3, in, PAIR_BYTES, MPI_BYTE, from, 3,
				     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (int k = 0; k < PAIR_BYTES; k++) {
				if (in[k] != (unsigned char)(from * 31 + rank * 7 + k)) {
					bad++;
					break;
				}
			}
			checked++;
		}
		MPI_Reduce(&bad, &tbad, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
		MPI_Reduce(&checked, &tchecked, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
		if (rank == 0)
			printf("pairs checked %d bad %d\n", tchecked, tbad);
		free(out);
		free(in);
	}

	if (size >= 2 && rank < 2) {
		int peer = 1 - rank;
		char small[8] = {0};
		char *big = calloc(1, bw_bytes > 0 ? bw_bytes : 1);
		if (big == NULL)
			MPI_Abort(MPI_COMM_WORLD, 2);
		/* warm up both paths */
		for (int i = 0; i < 10; i++) {
			if (rank == 0) {
				MPI_Send(small, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
				MPI_Recv(small, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else {
				MPI_Recv(small, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(small, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
			}
		}
		double t0 = MPI_Wtime();
		for (long i = 0; i < lat_iters; i++) {
			if (rank == 0) {
				MPI_Send(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
				MPI_Recv(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else {
				MPI_Recv(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
			}
		}
		double t1 = MPI_Wtime();
		for (long i = 0; i < bw_iters; i++) {
			if (rank == 0) {
				MPI_Send(big, bw_bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
				MPI_Recv(big, bw_bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else {
				MPI_Recv(big, bw_bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(big, bw_bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
			}
		}
		double t2 = MPI_Wtime();
		if (rank == 0) {
			if (lat_iters > 0)
				printf("pingpong latency_us %.3f bytes 8 iters %ld\n", (t1 - t0) / (2.0 * lat_iters) * 1e6, lat_iters);
			if (bw_iters > 0 && t2 > t1)
				printf("pingpong bandwidth_MBps %.1f bytes %ld iters %ld\n", 2.0 * bw_iters * bw_bytes / (t2 - t1) / 1e6, bw_bytes, bw_iters);
		}
		free(big);
	}
	fflush(stdout);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("done\n");
	MPI_Finalize();
	return 0;
}
