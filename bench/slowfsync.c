/* An LD_PRELOAD shim that makes fsync and fdatasync slow, as on an SD card.
 *
 * SLOW_FSYNC_MS: milliseconds added after each real call (default 5; 0 adds none).
 * SLOW_FSYNC_COUNT: if set, a file that gets one byte appended per call, so its size
 * counts the calls of every process and thread that loaded the shim.
 * It changes nothing else: the real call is made first and its result returned.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void after_sync(void) {
    int saved = errno;
    const char *count = getenv("SLOW_FSYNC_COUNT");
    if (count && *count) {
        int fd = open(count, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            (void)!write(fd, "s", 1);
            close(fd);
        }
    }
    const char *ms = getenv("SLOW_FSYNC_MS");
    long delay = ms && *ms ? strtol(ms, NULL, 10) : 5;
    if (delay > 0) {
        struct timespec ts = {delay / 1000, (delay % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int rc = real(fd);
    after_sync();
    return rc;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int rc = real(fd);
    after_sync();
    return rc;
}
