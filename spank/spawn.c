/*
 * spawn.c - running the launcher: fork/execve/waitpid, argv as an array,
 * never through a shell.
 *
 * slurmstepd, srun and sbatch are multi-threaded: between fork() and
 * execve() a child only makes async-signal-safe system calls, so
 * everything (argv, env, fds, signal sets) is prepared before the fork.
 * An execve() failure travels back through a close-on-exec pipe and is
 * logged by the parent.
 *
 * A child never keeps an inherited fd >= 3: a detached process holding the
 * step's stdout makes srun wait for EioTimeout (60 s, see DESIGN.md), and
 * slurmstepd leaks fds of its own.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "microvm.h"

/* Launcher calls made as root from slurmstepd get nothing of its env. */
char *const mv_clean_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	NULL,
};

/* Captured output kept for the log, in bytes. */
#define MV_CAPTURE_MAX 16384

/* ------------------------------------------------------------------ argv */

static int mv_argv_grow(struct mv_argv *a)
{
	size_t cap;
	char **v;

	if (a->n + 2 <= a->cap)
		return 0;
	cap = a->cap ? a->cap * 2 : 32;
	if (!(v = realloc(a->v, cap * sizeof(*v))))
		return -1;
	a->v = v;
	a->cap = cap;
	return 0;
}

void mv_argv_add(struct mv_argv *a, const char *s)
{
	char *copy;

	if (a->failed)
		return;
	if (!s || mv_argv_grow(a) < 0 || !(copy = strdup(s))) {
		a->failed = 1;
		return;
	}
	a->v[a->n++] = copy;
	a->v[a->n] = NULL;
}

void mv_argv_addf(struct mv_argv *a, const char *fmt, ...)
{
	char *s = NULL;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0) {
		a->failed = 1;
		return;
	}
	mv_argv_add(a, s);
	free(s);
}

void mv_argv_free(struct mv_argv *a)
{
	size_t i;

	for (i = 0; i < a->n; i++)
		free(a->v[i]);
	free(a->v);
	memset(a, 0, sizeof(*a));
}

void mv_argv_launcher(struct mv_argv *a, const char *subcommand)
{
	mv_argv_add(a, mv.cfg.launcher);
	mv_argv_add(a, "--config");
	mv_argv_add(a, mv.cfg.config);
	mv_argv_add(a, subcommand);
}

/* "a b c" for debug logs (NULL when out of memory). */
static char *mv_argv_join(const struct mv_argv *a)
{
	size_t i, len = 1;
	char *s;

	for (i = 0; i < a->n; i++)
		len += strlen(a->v[i]) + 1;
	if (!(s = malloc(len)))
		return NULL;
	s[0] = '\0';
	for (i = 0; i < a->n; i++) {
		if (i)
			strcat(s, " ");
		strcat(s, a->v[i]);
	}
	return s;
}

static int mv_argv_usable(const char *what, const struct mv_argv *a)
{
	char *line;

	if (!a || a->failed || !a->v || !a->n) {
		mv_error("%s: out of memory building the command line", what);
		return 0;
	}
	if ((line = mv_argv_join(a))) {
		mv_debug("%s: %s", what, line);
		free(line);
	}
	return 1;
}

/* ----------------------------------------------------- child-side steps */

/* Everything a child needs, prepared before fork(). */
struct mv_child {
	char *const *argv;
	char *const *envp;
	struct sigaction dfl;
	sigset_t empty;
};

static void mv_child_prepare(struct mv_child *c, const struct mv_argv *a,
			     char *const envp[])
{
	memset(c, 0, sizeof(*c));
	c->argv = a->v;
	c->envp = envp;
	c->dfl.sa_handler = SIG_DFL;
	sigemptyset(&c->dfl.sa_mask);
	sigemptyset(&c->empty);
}

/* Moves fd above stdio, close-on-exec (the original is closed). */
static int mv_fd_high(int fd)
{
	int nfd;

	if (fd < 0 || fd > 2)
		return fd;
	nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	close(fd);
	return nfd;
}

struct mv_dirent64 {
	unsigned long long d_ino;
	long long d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/* Child only: closes every fd >= low (async-signal-safe). */
static void mv_child_close_from(int low)
{
	char buf[4096];
	long n, off;
	int dfd;

#ifdef SYS_close_range
	if (syscall(SYS_close_range, (unsigned)low, ~0u, 0u) == 0)
		return;
#endif
	/* Kernels before 5.9: walk /proc/self/fd with raw getdents64. */
	dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		while ((n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) >
		       0) {
			for (off = 0; off < n;) {
				struct mv_dirent64 *d =
					(struct mv_dirent64 *)(buf + off);
				const char *p = d->d_name;
				int fd = 0;

				off += d->d_reclen;
				if (*p < '0' || *p > '9')
					continue;
				for (; *p >= '0' && *p <= '9'; p++)
					fd = fd * 10 + (*p - '0');
				if (fd >= low && fd != dfd)
					close(fd);
			}
		}
		close(dfd);
		return;
	}
	for (n = low; n < 65536; n++)
		close((int)n);
}

/*
 * Child only: fd 3 becomes the close-on-exec status pipe, every other fd
 * >= 3 is closed, signals are reset, and argv is executed. On failure the
 * errno goes to the pipe and the child exits 127.
 */
static void __attribute__((noreturn))
mv_child_exec(const struct mv_child *c, int status_fd, int stage)
{
	int msg[2];
	int sig;

	if (status_fd != 3) {
		if (dup3(status_fd, 3, O_CLOEXEC) < 0)
			_exit(127);
		status_fd = 3;
	}
	mv_child_close_from(4);
	for (sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			sigaction(sig, &c->dfl, NULL);
	sigprocmask(SIG_SETMASK, &c->empty, NULL);

	execve(c->argv[0], c->argv, c->envp);
	msg[0] = stage;
	msg[1] = errno;
	if (write(status_fd, msg, sizeof(msg)) < 0)
		_exit(127);
	_exit(127);
}

/* Reads the {stage, errno} a child reported; 0 when none (exec done). */
static int mv_read_status(int fd, int *stage, int *err)
{
	int msg[2];
	ssize_t n;

	do {
		n = read(fd, msg, sizeof(msg));
	} while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(msg))
		return 0;
	*stage = msg[0];
	*err = msg[1];
	return 1;
}

static long long mv_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static pid_t mv_waitpid(pid_t pid, int *status, int flags)
{
	pid_t r;

	do {
		r = waitpid(pid, status, flags);
	} while (r < 0 && errno == EINTR);
	return r;
}

/* ---------------------------------------------------- synchronous calls */

struct mv_capture {
	char buf[MV_CAPTURE_MAX + 1];
	size_t n;
	int truncated;
};

enum { MV_READ_DONE, MV_READ_DATA, MV_READ_AGAIN };

/* Reads what is available on fd: DONE at EOF or error. */
static int mv_capture_read(struct mv_capture *cap, int fd)
{
	char tmp[4096];
	ssize_t n = read(fd, tmp, sizeof(tmp));

	if (n < 0)
		return (errno == EINTR || errno == EAGAIN) ? MV_READ_AGAIN
							   : MV_READ_DONE;
	if (n == 0)
		return MV_READ_DONE;
	if (cap->n < MV_CAPTURE_MAX) {
		size_t take = (size_t)n;

		if (take > MV_CAPTURE_MAX - cap->n) {
			take = MV_CAPTURE_MAX - cap->n;
			cap->truncated = 1;
		}
		memcpy(cap->buf + cap->n, tmp, take);
		cap->n += take;
	} else {
		cap->truncated = 1;
	}
	return MV_READ_DATA;
}

/* Logs captured output line by line: errors if the call failed. */
static void mv_capture_log(struct mv_capture *cap, const char *what,
			   int failed)
{
	char *line = cap->buf, *eol;

	cap->buf[cap->n] = '\0';
	while (line && *line) {
		if ((eol = strchr(line, '\n')))
			*eol = '\0';
		if (*line) {
			if (failed)
				mv_error("%s: %s", what, line);
			else
				mv_debug("%s: %s", what, line);
		}
		line = eol ? eol + 1 : NULL;
	}
	if (cap->truncated)
		mv_error("%s: (output truncated to %d bytes)", what,
			 MV_CAPTURE_MAX);
}

/* The last non-empty line of the captured output, copied; NULL if none. */
static char *mv_capture_last_line(const struct mv_capture *cap)
{
	size_t end = cap->n, start;

	while (end > 0 && (cap->buf[end - 1] == '\n' ||
			   cap->buf[end - 1] == '\r'))
		end--;
	if (!end)
		return NULL;
	start = end;
	while (start > 0 && cap->buf[start - 1] != '\n')
		start--;
	return strndup(cap->buf + start, end - start);
}

/*
 * Opens /dev/null and the status pipe a child reports its failed stage on,
 * all above the fds a task may use (mv_fd_high). On error the message is
 * logged and the caller's cleanup closes what was opened.
 */
static int mv_child_fds(const char *what, int *devnull, int statp[2])
{
	*devnull = mv_fd_high(open("/dev/null", O_RDWR | O_CLOEXEC));
	if (*devnull < 0 || pipe2(statp, O_CLOEXEC) < 0 ||
	    (statp[0] = mv_fd_high(statp[0])) < 0 ||
	    (statp[1] = mv_fd_high(statp[1])) < 0) {
		mv_error("%s: cannot set up /dev/null and pipes: %s", what,
			 strerror(errno));
		return -1;
	}
	return 0;
}

int mv_run(const char *what, const struct mv_argv *a, char *const envp[],
	   enum mv_output output, unsigned timeout_s, char **why)
{
	char reason[512] = "";
	struct mv_capture *cap = NULL;
	struct mv_child c;
	int devnull = -1, outp[2] = { -1, -1 }, statp[2] = { -1, -1 };
	int status = 0, stage = 0, err = 0, rc = -1;
	int exited = 0, timed_out = 0, lost = 0;
	long long deadline;
	int backoff = 1;
	pid_t pid;

	if (!mv_argv_usable(what, a))
		return -1;
	mv_child_prepare(&c, a, envp);

	if (mv_child_fds(what, &devnull, statp) < 0)
		goto out;
	if (output == MV_OUTPUT_LOG) {
		if (!(cap = calloc(1, sizeof(*cap))) ||
		    pipe2(outp, O_CLOEXEC) < 0 ||
		    (outp[0] = mv_fd_high(outp[0])) < 0 ||
		    (outp[1] = mv_fd_high(outp[1])) < 0) {
			mv_error("%s: cannot set up the output pipe: %s", what,
				 strerror(errno));
			goto out;
		}
	}

	pid = fork();
	if (pid == 0) {
		dup2(devnull, STDIN_FILENO);
		if (output == MV_OUTPUT_LOG) {
			dup2(outp[1], STDOUT_FILENO);
			dup2(outp[1], STDERR_FILENO);
		} else {
			/* stderr passes through; stdout joins it. */
			if (fcntl(STDERR_FILENO, F_SETFD, 0) < 0)
				dup2(devnull, STDERR_FILENO);
			dup2(STDERR_FILENO, STDOUT_FILENO);
		}
		mv_child_exec(&c, statp[1], 0);
	}
	if (pid < 0) {
		mv_error("%s: fork: %s", what, strerror(errno));
		goto out;
	}
	close(statp[1]);
	statp[1] = -1;
	if (outp[1] >= 0) {
		close(outp[1]);
		outp[1] = -1;
	}

	deadline = mv_now_ms() + (long long)timeout_s * 1000;
	for (;;) {
		pid_t r = mv_waitpid(pid, &status, WNOHANG);
		long long left;
		struct pollfd pfd;

		if (r == pid) {
			exited = 1;
			break;
		}
		if (r < 0) {
			lost = 1; /* reaped by someone else (ECHILD) */
			break;
		}
		left = deadline - mv_now_ms();
		if (left <= 0) {
			timed_out = 1;
			kill(pid, SIGKILL);
			mv_waitpid(pid, &status, 0);
			break;
		}
		if (left > backoff)
			left = backoff;
		if (backoff < 20)
			backoff *= 2;
		pfd.fd = outp[0];
		pfd.events = POLLIN;
		pfd.revents = 0;
		if (poll(&pfd, outp[0] >= 0 ? 1 : 0, (int)left) > 0 &&
		    mv_capture_read(cap, outp[0]) == MV_READ_DONE) {
			close(outp[0]);
			outp[0] = -1;
		}
	}
	/* What is left in the pipe; a grandchild may keep it open: no wait. */
	if (outp[0] >= 0 && fcntl(outp[0], F_SETFL, O_NONBLOCK) == 0)
		while (mv_capture_read(cap, outp[0]) == MV_READ_DATA)
			;

	if (mv_read_status(statp[0], &stage, &err)) {
		snprintf(reason, sizeof(reason), "cannot execute %s: %s",
			 a->v[0], strerror(err));
	} else if (timed_out) {
		snprintf(reason, sizeof(reason),
			 "%s gave no answer in %u s: killed (pid %d)", a->v[0],
			 timeout_s, (int)pid);
	} else if (lost || !exited) {
		snprintf(reason, sizeof(reason), "lost track of %s (pid %d)",
			 a->v[0], (int)pid);
	} else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		rc = 0;
	} else if (WIFEXITED(status)) {
		snprintf(reason, sizeof(reason), "%s exited with status %d",
			 a->v[0], WEXITSTATUS(status));
	} else if (WIFSIGNALED(status)) {
		snprintf(reason, sizeof(reason), "%s was killed by signal %d",
			 a->v[0], WTERMSIG(status));
	}
	if (rc < 0) {
		mv_error("%s: %s", what, reason);
		if (why && !(cap && (*why = mv_capture_last_line(cap))))
			*why = strdup(reason);
	}
	if (cap)
		mv_capture_log(cap, what, rc < 0);
out:
	if (devnull >= 0)
		close(devnull);
	if (statp[0] >= 0)
		close(statp[0]);
	if (statp[1] >= 0)
		close(statp[1]);
	if (outp[0] >= 0)
		close(outp[0]);
	if (outp[1] >= 0)
		close(outp[1]);
	free(cap);
	return rc;
}

/* ------------------------------------------------------ detached calls */

enum { MV_STAGE_EXEC, MV_STAGE_SETSID, MV_STAGE_FORK };

static void mv_report(int fd, int stage, int err)
{
	int msg[2] = { stage, err };

	if (write(fd, msg, sizeof(msg)) < 0)
		_exit(1);
}

int mv_spawn_detached(const char *what, const struct mv_argv *a,
		      char *const envp[], unsigned timeout_s)
{
	static const char *const stages[] = { "execve", "setsid", "fork" };
	struct mv_child c;
	int devnull = -1, statp[2] = { -1, -1 };
	int status = 0, stage = 0, err = 0, rc = -1, n;
	struct pollfd pfd;
	pid_t pid;

	if (!mv_argv_usable(what, a))
		return -1;
	mv_child_prepare(&c, a, envp);

	if (mv_child_fds(what, &devnull, statp) < 0)
		goto out;

	pid = fork();
	if (pid == 0) {
		pid_t grandchild;

		/* Intermediate: new session, fork, exit at once. */
		close(statp[0]);
		if (setsid() < 0) {
			mv_report(statp[1], MV_STAGE_SETSID, errno);
			_exit(1);
		}
		grandchild = fork();
		if (grandchild < 0) {
			mv_report(statp[1], MV_STAGE_FORK, errno);
			_exit(1);
		}
		if (grandchild > 0)
			_exit(0);
		/* Grandchild: no session leader, no tty, no fd of the step. */
		dup2(devnull, STDIN_FILENO);
		dup2(devnull, STDOUT_FILENO);
		dup2(devnull, STDERR_FILENO);
		if (chdir("/") < 0)
			_exit(127);
		mv_child_exec(&c, statp[1], MV_STAGE_EXEC);
	}
	if (pid < 0) {
		mv_error("%s: fork: %s", what, strerror(errno));
		goto out;
	}
	close(statp[1]);
	statp[1] = -1;
	close(devnull);
	devnull = -1;

	/* Reap the intermediate child now: no zombie is left behind. */
	if (mv_waitpid(pid, &status, 0) == pid &&
	    !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
		if (mv_read_status(statp[0], &stage, &err))
			mv_error("%s: %s: %s", what,
				 stages[stage >= 0 && stage <= 2 ? stage : 0],
				 strerror(err));
		else
			mv_error("%s: the intermediate child failed (status "
				 "0x%x)", what, (unsigned)status);
		goto out;
	}

	/* EOF once the grandchild's execve() closed the status pipe. */
	pfd.fd = statp[0];
	pfd.events = POLLIN;
	do {
		n = poll(&pfd, 1, (int)(timeout_s * 1000u));
	} while (n < 0 && errno == EINTR);
	if (n == 0) {
		mv_error("%s: %s did not start within %u s", what, a->v[0],
			 timeout_s);
		goto out;
	}
	if (mv_read_status(statp[0], &stage, &err)) {
		mv_error("%s: cannot execute %s: %s", what, a->v[0],
			 strerror(err));
		goto out;
	}
	rc = 0;
out:
	if (devnull >= 0)
		close(devnull);
	if (statp[0] >= 0)
		close(statp[0]);
	if (statp[1] >= 0)
		close(statp[1]);
	return rc;
}
