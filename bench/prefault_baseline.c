/* SPDX-License-Identifier: Apache-2.0
 *
 * The kernel's page-population speed, for the prefault benchmark (bench/prefault.py):
 * create SIZE bytes of shared memory (SysV or memfd), then THREADS pthreads each
 * write one byte per page of a disjoint slice.  Prints one JSON line with the time
 * from creation to the last page, measured here so process start-up is not counted.
 *
 *   prefault_baseline SIZE_BYTES THREADS sysv|sysv-huge|anon|anon-thp|memfd
 *
 * The segment is marked for removal (IPC_RMID) right after attaching and the memfd
 * is anonymous, so nothing outlives this process, whatever happens to it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct slice {
    volatile char *start;
    size_t len;
    size_t page;
};

static void *touch(void *arg)
{
    struct slice *s = arg;
    for (size_t off = 0; off < s->len; off += s->page)
        s->start[off] = 1;      /* a write fault: the kernel allocates and zeroes */
    return NULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s SIZE_BYTES THREADS sysv|memfd\n", argv[0]);
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10);
    int nthreads = atoi(argv[2]);
    const char *kind = argv[3];
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size == 0 || nthreads < 1) {
        fprintf(stderr, "bad size or thread count\n");
        return 2;
    }
    size = (size + page - 1) / page * page;

    double t0 = now();
    char *base;
    if (strcmp(kind, "sysv") == 0) {
        int id = shmget(IPC_PRIVATE, size, IPC_CREAT | 0600);
        if (id < 0) {
            perror("shmget");
            return 1;
        }
        base = shmat(id, NULL, 0);
        int saved = errno;
        shmctl(id, IPC_RMID, NULL);   /* freed when the last attach goes away */
        if (base == (char *)-1) {
            errno = saved;
            perror("shmat");
            return 1;
        }
    } else if (strcmp(kind, "sysv-huge") == 0) {      /* hugetlb: 2 MiB pages */
        page = 2 << 20;
        size = (size + page - 1) / page * page;
        int id = shmget(IPC_PRIVATE, size, IPC_CREAT | SHM_HUGETLB | 0600);
        if (id < 0) {
            perror("shmget(SHM_HUGETLB)");
            return 1;
        }
        base = shmat(id, NULL, 0);
        shmctl(id, IPC_RMID, NULL);
        if (base == (char *)-1) {
            perror("shmat");
            return 1;
        }
    } else if (strcmp(kind, "anon") == 0 || strcmp(kind, "anon-thp") == 0) {
        base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        if (strcmp(kind, "anon-thp") == 0 && madvise(base, size, MADV_HUGEPAGE) != 0) {
            perror("madvise(MADV_HUGEPAGE)");
            return 1;
        }
    } else if (strcmp(kind, "memfd") == 0) {
        int fd = (int)syscall(SYS_memfd_create, "prefault-baseline", 0);
        if (fd < 0) {
            perror("memfd_create");
            return 1;
        }
        if (ftruncate(fd, (off_t)size) != 0) {
            perror("ftruncate");
            return 1;
        }
        base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (base == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
    } else {
        fprintf(stderr, "kind must be sysv, sysv-huge, anon, anon-thp or memfd\n");
        return 2;
    }

    size_t pages = size / page;
    size_t per = (pages + nthreads - 1) / nthreads;
    pthread_t *tid = calloc(nthreads, sizeof *tid);
    struct slice *sl = calloc(nthreads, sizeof *sl);
    int started = 0;
    for (int i = 0; i < nthreads; i++) {
        size_t first = (size_t)i * per;
        if (first >= pages)
            break;
        size_t n = pages - first < per ? pages - first : per;
        sl[i].start = base + first * page;
        sl[i].len = n * page;
        sl[i].page = page;
        if (pthread_create(&tid[i], NULL, touch, &sl[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
        started++;
    }
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    double t1 = now();

    printf("{\"seconds\": %.9f, \"bytes\": %zu, \"threads\": %d, \"kind\": \"%s\", "
           "\"page\": %zu}\n", t1 - t0, size, started, kind, page);
    return 0;
}
