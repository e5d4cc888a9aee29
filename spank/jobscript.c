/*
 * jobscript.c - the job script context (slurmd's `slurmstepd spank epilog`,
 * root, once per job and node when the job ends).
 *
 * `slurm-microvm gc --job J` removes whatever a crash, a requeue or a killed
 * slurmstepd left of job J on this node. It runs for every job (a step may
 * have used --microvm even when the job did not) and must be a fast no-op
 * when nothing is left. A failure fails the epilog, and Slurm drains the
 * node: resources of a dead job may still be held.
 */
#include <errno.h>
#include <stdlib.h>

#include "microvm.h"

/* The job id from SLURM_JOB_ID, strictly decimal. */
static int mv_job_id_from_env(uint32_t *job)
{
	const char *v = getenv("SLURM_JOB_ID");
	char *end = NULL;
	unsigned long n;

	if (!v || *v < '0' || *v > '9')
		return -1;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (errno || *end || n > UINT32_MAX)
		return -1;
	*job = (uint32_t)n;
	return 0;
}

int mv_job_epilog(spank_t sp)
{
	struct mv_argv a = { 0 };
	uint32_t job = 0;
	char node[65] = "";
	const char *env;
	int rc;

	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS &&
	    mv_job_id_from_env(&job) < 0) {
		mv_error("job epilog: no job id (neither S_JOB_ID nor "
			 "SLURM_JOB_ID): nothing collected");
		return -1;
	}

	mv_argv_launcher(&a, "gc");
	mv_argv_add(&a, "--job");
	mv_argv_addf(&a, "%u", job);
	/* The epilog's environment names the node (multiple-slurmd). */
	if (spank_getenv(sp, "SLURMD_NODENAME", node, sizeof(node)) ==
		    ESPANK_SUCCESS && node[0]) {
		mv_argv_add(&a, "--node");
		mv_argv_add(&a, node);
	} else if ((env = getenv("SLURMD_NODENAME")) && env[0]) {
		mv_argv_add(&a, "--node");
		mv_argv_add(&a, env);
	}
	rc = mv_run("gc", &a, mv_clean_env, MV_OUTPUT_LOG, mv.cfg.timeout_s,
		    NULL);
	mv_argv_free(&a);
	if (rc < 0)
		mv_error("job %u: gc failed: microVM state of the job may be "
			 "left on this node", job);
	return rc;
}
