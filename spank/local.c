/*
 * local.c - srun (local context), sbatch and salloc (allocator context).
 *
 * These run as the submitting user, in the user's own process, before the
 * job is queued (init_post_opt) or before the step is launched
 * (local_user_init, srun only). Bad input fails here, with the launcher's
 * own message on the user's terminal, instead of on a compute node later.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "microvm.h"

extern char **environ;

/*
 * srun/sbatch/salloc after option parsing: run
 *   <launcher> --config F validate --image IMG [--debug] [--mounts ...]
 * as the calling user, stderr passed through. Non-zero refuses the job,
 * as do --microvm-* options without --microvm (mv_options_orphan).
 */
int mv_local_init_post_opt(spank_t sp)
{
	struct mv_argv a = { 0 };
	int rc;

	(void)sp;
	if (!mv.opt.image) {
		char *orphan = mv_options_orphan();

		if (!orphan)
			return 0;
		mv_error("%s", orphan);
		free(orphan);
		return -1;
	}

	mv_argv_launcher(&a, "validate");
	mv_argv_add(&a, "--image");
	mv_argv_add(&a, mv.opt.image);
	mv_argv_options(&a);
	rc = mv_run("validate", &a, environ, MV_OUTPUT_PASS,
		    mv.cfg.timeout_s, NULL);
	mv_argv_free(&a);
	if (rc < 0) {
		mv_error("--microvm=%s refused by %s validate (reason above)",
			 mv.opt.image, mv.cfg.launcher);
		return -1;
	}
	return 0;
}

/*
 * Reads the regular file path into a NUL-terminated buffer of at most max
 * bytes; NULL if it cannot be read whole. Never blocks on a FIFO or device.
 */
static char *mv_read_small_file(const char *path, size_t max)
{
	struct stat st;
	char *buf = NULL;
	size_t got = 0;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    (size_t)st.st_size > max)
		goto fail;
	if (!(buf = malloc((size_t)st.st_size + 1)))
		goto fail;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

		if (n <= 0)
			goto fail;
		got += (size_t)n;
	}
	buf[got] = '\0';
	close(fd);
	return buf;
fail:
	free(buf);
	close(fd);
	return NULL;
}

/*
 * srun --multi-prog replaces argv by { file, contents of file, ... }
 * (Slurm 22.05 launch_slurm.c _load_multi, files up to 60000 bytes). In
 * srun the file is at hand: if argv[1] is exactly its contents, this is
 * --multi-prog. The shape test of args.c catches the rest.
 */
static int mv_local_is_multi_prog(int argc, char **argv)
{
	char *data;
	int same;

	if (argc < 2 || !argv || !argv[0] || !argv[1])
		return 0;
	if (mv_is_multi_prog_data(argc, argv))
		return 1;
	if (!(data = mv_read_small_file(argv[0], 60000)))
		return 0;
	same = strcmp(data, argv[1]) == 0;
	free(data);
	return same;
}

/* srun, after the allocation and before the launch: refuse --multi-prog. */
int mv_local_user_init(spank_t sp)
{
	char **argv = NULL;
	int argc = 0;

	if (!mv.opt.image)
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS) {
		mv_debug("local_user_init: no S_JOB_ARGV");
		return 0;
	}
	if (mv_local_is_multi_prog(argc, argv)) {
		mv_error(MV_MULTI_PROG_MSG);
		return -1;
	}
	return 0;
}
