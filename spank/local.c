/*
 * local.c - srun (local context), sbatch and salloc (allocator context).
 *
 * These run as the submitting user, in the user's own process, before the
 * job is queued (init_post_opt) or before the step is launched
 * (local_user_init, srun only). Bad input fails here, with the launcher's
 * own message on the user's terminal, instead of on a compute node later.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>

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

	if (mv_options_env(sp, 0) < 0)
		return -1;
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
		mv_error("--microvm=%s refused by %s validate (reason above)%s%s",
			 mv.opt.image, mv.cfg.launcher,
			 mv.opt.from_env[0] ? "; options taken from the "
					      "environment: " : "",
			 mv.opt.from_env);
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

/*
 * The job's memory request reaches slurmstepd as SLURM_MEM_PER_NODE or
 * SLURM_MEM_PER_CPU in the step's environment: jobs that sbatch or salloc
 * allocated carry them already, a job that srun allocated itself carries
 * neither (Slurm 22.05, measured). For those, srun reads the job's request
 * (job_info_t.pn_min_memory, one slurm_load_job of the user's own job)
 * and exports the same variable, which srun then sends with the step.
 * Where Slurm allocates memory this changes nothing (S_STEP_ALLOC_MEM
 * wins); where it does not, the guest is sized from it.
 */
static void mv_local_export_mem(spank_t sp)
{
	job_info_msg_t *msg = NULL;
	uint32_t job = 0;
	uint64_t mem;
	const char *name;
	char buf[32];

	if (getenv("SLURM_MEM_PER_NODE") || getenv("SLURM_MEM_PER_CPU"))
		return;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
		return;
	if (slurm_load_job(&msg, job, SHOW_ALL) != 0 || !msg ||
	    msg->record_count < 1) {
		mv_debug("job %u: cannot read its memory request: the guest "
			 "is sized from the allocation or the default", job);
		if (msg)
			slurm_free_job_info_msg(msg);
		return;
	}
	mem = msg->job_array[0].pn_min_memory;
	slurm_free_job_info_msg(msg);
	if (mem == NO_VAL64 || !(mem & ~MEM_PER_CPU))
		return;
	name = (mem & MEM_PER_CPU) ? "SLURM_MEM_PER_CPU" : "SLURM_MEM_PER_NODE";
	snprintf(buf, sizeof(buf), "%llu",
		 (unsigned long long)(mem & ~MEM_PER_CPU));
	if (setenv(name, buf, 0) < 0)
		mv_debug("job %u: cannot export %s", job, name);
}

/*
 * srun, after the allocation and before the launch: refuse --multi-prog;
 * export the job's memory request for the step.
 */
int mv_local_user_init(spank_t sp)
{
	char **argv = NULL;
	int argc = 0;

	if (!mv.opt.image)
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS)
		mv_debug("local_user_init: no S_JOB_ARGV");
	else if (mv_local_is_multi_prog(argc, argv)) {
		mv_error(MV_MULTI_PROG_MSG);
		return -1;
	}
	mv_local_export_mem(sp);
	return 0;
}
