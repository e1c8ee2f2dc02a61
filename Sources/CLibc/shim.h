// libc for the modules the firmware links. Embedded Swift has no Glibc module, so the
// headers the gateway uses come through this one map in both builds (docs/firmware.md).
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <pwd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>

// errno is a macro over a thread-local and fcntl is variadic: neither imports into Swift, and
// Embedded Swift has no Glibc overlay that would wrap them. BatonLibc wraps these.
static inline int baton_errno(void) { return errno; }
static inline void baton_set_errno(int value) { errno = value; }
static inline int baton_fcntl_get(int fd, int command) { return fcntl(fd, command); }
static inline int baton_fcntl_set(int fd, int command, int value) { return fcntl(fd, command, value); }
static inline long long baton_monotonic_nanoseconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
static inline int baton_open(const char *path, int flags) { return open(path, flags); }
static inline int baton_ioctl_int(int fd, unsigned long request, int value) { return ioctl(fd, request, value); }
extern char **environ;
static inline char **baton_environ(void) { return environ; }
// SIG_IGN and SIG_DFL are casts of integers to handler pointers: macros Swift cannot import.
static inline void baton_signal_ignore(int sig) { signal(sig, SIG_IGN); }
static inline void baton_signal_default(int sig) { signal(sig, SIG_DFL); }
// getopt's state lives in globals, which Swift 6 refuses to touch unsynchronized; the gateway
// parses its arguments once, on its only thread, before anything else runs.
static inline int baton_getopt_long(int argc, char **argv, const char *shortopts, const struct option *longopts) {
    return getopt_long(argc, argv, shortopts, longopts, NULL);
}
// RLIMIT_NOFILE is an enum constant under _GNU_SOURCE and a macro otherwise, and RLIM_INFINITY
// a macro: the open-file limit is read and raised here, in rlim_t's own width.
static inline int baton_open_file_limit(unsigned long long *soft, unsigned long long *hard) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
    *soft = r.rlim_cur == RLIM_INFINITY ? ~0ULL : (unsigned long long)r.rlim_cur;
    *hard = r.rlim_max == RLIM_INFINITY ? ~0ULL : (unsigned long long)r.rlim_max;
    return 0;
}
static inline int baton_set_open_file_soft_limit(unsigned long long soft) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
    r.rlim_cur = (rlim_t)soft;
    return setrlimit(RLIMIT_NOFILE, &r);
}
static inline void baton_getopt_reset(void) { optind = 1; opterr = 1; }
static inline int baton_optind(void) { return optind; }
static inline const char *baton_optarg(void) { return optarg; }
