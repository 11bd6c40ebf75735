/* SPDX-License-Identifier: Apache-2.0
 *
 * Peak RSS of a command, for the footprint benchmark (bench/imports.py).
 *
 *   rss_probe COMMAND [ARGS...]   ->  prints "MAXRSS_KB WALL_SECONDS EXIT_STATUS"
 *
 * Why a C launcher: Linux carries the pre-exec image's RSS high-water mark into
 * ru_maxrss across execve (fs/exec.c, exec_mmap -> setmax_mm_hiwater_rss), and a
 * child forked (or vforked) straight from the benchmark's Python process starts with
 * that process's RSS.  Forked from this small program instead, the command's
 * ru_maxrss is its own.  The command's stdout goes to /dev/null.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s COMMAND [ARGS...]\n", argv[0]);
        return 2;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            close(fd);
        }
        execvp(argv[1], argv + 1);
        perror("execvp");
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("wait4");
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    printf("%ld %.6f %d\n", ru.ru_maxrss, (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9,
           rc);
    return 0;
}
