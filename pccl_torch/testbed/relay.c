/* The testbed's delay relay in C: the same relay as relay.py (see its docstring), compiled by `pccl-testbed up` with
 * the system's C compiler where there is one. It takes relay.py's command line and keeps its rules: every frame read
 * from one end of a link is written to the other end `delay` seconds later (a quarter of the round-trip time), moved
 * by a uniform draw in [-jitter, +jitter] (a quarter of the round-trip jitter), never before the frame read before
 * it on the same end (no reordering), and dropped when its direction already holds --limit-bytes. A timerfd wakes
 * it to the microsecond (Python's relay sleeps its last millisecond with nanosleep and pays more per wake-up: at a
 * 0.5 ms round trip, 0.64 ms measured here against 0.72 ms), and its own work per frame is a copy (at 1 Gbit/s,
 * user time ~3% of a core against Python's ~4%). Most of either relay's CPU is system time: the far node's receive
 * path (bridge, tbf, TCP) runs inside its write() to the TAP device.
 *
 *   cc -O2 -o pccl-relay relay.c
 *   pccl-relay --prefix P --nodes N --delay RTT [--jitter J] --state DIR [--limit-bytes B] [--detach]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_LINKS 250
#define READ_SIZE (65536 + 64)  /* more than any TAP frame: MTU <= 65521 plus the Ethernet header */
#define READS_PER_ROUND 64      /* frames read from one device before the clock is looked at again */
#define NICE (-10)              /* ahead of MPI ranks spinning on the same cores where real time is refused (relay.py: NICE) */
#define RT_PRIORITY 10          /* SCHED_FIFO: frames leave on time whatever the ranks do (relay.py: RT_PRIORITY) */

struct frame {                  /* one frame held, in the order read */
    struct frame *next;
    double due;                 /* CLOCK_MONOTONIC seconds at which it leaves */
    size_t len;
    unsigned char data[];
};

struct line {                   /* one direction of one link end: read from `in`, written to `out` */
    int in, out;
    struct frame *head, *tail;
    size_t held;                /* bytes held */
    double last_due;            /* due time of the frame read last */
    unsigned long dropped;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "relay: %s%s%s: %s\n", what, detail ? " " : "", detail ? detail : "", strerror(errno));
    exit(1);
}

/* "500us", "2ms", "0.1s" -> seconds; exits with a message otherwise (relay.py: parse_time). */
static double parse_time(const char *text) {
    char *end;
    double value = strtod(text, &end);
    double scale = !strcmp(end, "us") ? 1e-6 : !strcmp(end, "ms") ? 1e-3 : !strcmp(end, "s") ? 1.0 : -1;
    if (end == text || scale < 0 || value < 0) {
        fprintf(stderr, "relay: cannot read time '%s': expected a number and a unit, e.g. 500us, 2ms\n", text);
        exit(2);
    }
    return value * scale;
}

/* A non-blocking descriptor on persistent TAP device `device` of network namespace `ns` (relay.py: open_tap). */
static int open_tap(const char *ns, const char *device) {
    char path[300];
    snprintf(path, sizeof path, "/run/netns/%s", ns);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) die("cannot enter network namespace", ns);
    close(nsfd);
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) die("cannot open", "/dev/net/tun");
    struct ifreq req;
    memset(&req, 0, sizeof req);
    strncpy(req.ifr_name, device, IFNAMSIZ - 1);
    req.ifr_flags = IFF_TAP | IFF_NO_PI;
    if (ioctl(fd, TUNSETIFF, &req) != 0) die("cannot attach to TAP device", device);
    return fd;
}

/* relay.py: due_time. */
static double due_time(double now, double delay, double jitter, double last_due, double draw) {
    double held = delay + jitter * (2 * draw - 1);
    double due = now + (held > 0 ? held : 0);
    return due > last_due ? due : last_due;
}

static void hold(struct line *l, const unsigned char *data, size_t len, double now, double delay, double jitter,
                 size_t limit) {
    if (l->held + len > limit) {
        l->dropped++;
        return;
    }
    struct frame *f = malloc(sizeof *f + len);
    if (!f) {
        l->dropped++;
        return;
    }
    memcpy(f->data, data, len);
    f->len = len;
    f->next = NULL;
    f->due = l->last_due = due_time(now, delay, jitter, l->last_due, jitter > 0 ? drand48() : 0.5);
    if (l->tail) l->tail->next = f; else l->head = f;
    l->tail = f;
    l->held += len;
}

/* Write every frame of `l` due at `now`; a frame the device refuses is lost, as on a wire. */
static void send_due(struct line *l, double now) {
    while (l->head && l->head->due <= now) {
        struct frame *f = l->head;
        if (write(l->out, f->data, f->len) < 0) { /* lost */ }
        l->head = f->next;
        if (!l->head) l->tail = NULL;
        l->held -= f->len;
        free(f);
    }
}

/* Arm `timer` for the earliest due frame of `lines` (disarm when none). */
static void arm(int timer, struct line *lines, int n) {
    double first = INFINITY;
    for (int i = 0; i < n; i++)
        if (lines[i].head && lines[i].head->due < first) first = lines[i].head->due;
    struct itimerspec when;
    memset(&when, 0, sizeof when);
    if (first != INFINITY) {
        when.it_value.tv_sec = (time_t)first;
        when.it_value.tv_nsec = (long)((first - (double)(time_t)first) * 1e9);
        if (when.it_value.tv_sec == 0 && when.it_value.tv_nsec == 0) when.it_value.tv_nsec = 1;
    }
    timerfd_settime(timer, TFD_TIMER_ABSTIME, &when, NULL);
}

static void detach(const char *state) {
    pid_t child = fork();
    if (child < 0) die("cannot fork", NULL);
    if (child > 0) _exit(0);
    setsid();
    char path[4200];
    snprintf(path, sizeof path, "%s/relay.log", state);
    int log = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(log, 1);
    dup2(log, 2);
    close(null);
    close(log);
}

static void write_pid(const char *state, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", state, name);
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write", path);
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
}

int main(int argc, char **argv) {
    const char *prefix = NULL, *state = NULL, *delay_text = NULL, *jitter_text = "0ms";
    int nodes = 0, detached = 0;
    size_t limit = 64u << 20;
    for (int i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--detach")) { detached = 1; continue; }
        if (!value) { fprintf(stderr, "relay: %s needs a value\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--prefix")) prefix = value;
        else if (!strcmp(argv[i], "--nodes")) nodes = atoi(value);
        else if (!strcmp(argv[i], "--delay")) delay_text = value;
        else if (!strcmp(argv[i], "--jitter")) jitter_text = value;
        else if (!strcmp(argv[i], "--state")) state = value;
        else if (!strcmp(argv[i], "--limit-bytes")) limit = strtoull(value, NULL, 10);
        else { fprintf(stderr, "relay: unknown argument %s\n", argv[i]); return 2; }
        i++;
    }
    if (!prefix || !state || !delay_text || nodes < 1 || nodes > MAX_LINKS) {
        fprintf(stderr, "usage: %s --prefix P --nodes N (1-%d) --delay RTT [--jitter J] --state DIR "
                "[--limit-bytes B] [--detach]\n", argv[0], MAX_LINKS);
        return 2;
    }
    double delay = parse_time(delay_text) / 4, jitter = parse_time(jitter_text) / 4;  /* relay.py: leg_delay */
    if (detached) detach(state);
    write_pid(state, "relay.pid");
    struct sched_param rt = {.sched_priority = RT_PRIORITY};
    if (sched_setscheduler(0, SCHED_FIFO, &rt) != 0 && setpriority(PRIO_PROCESS, 0, NICE) != 0)
        fprintf(stderr, "relay: cannot raise its priority to nice %d; frames may be late on busy cores\n", NICE);
    srand48(getpid() ^ (long)time(NULL));
    static struct line lines[2 * MAX_LINKS];
    int n = 2 * nodes;
    for (int k = 0; k < nodes; k++) {
        char node_ns[64], hub_ns[64], hub_dev[16];
        snprintf(node_ns, sizeof node_ns, "%s-n%d", prefix, k);
        snprintf(hub_ns, sizeof hub_ns, "%s-hub", prefix);
        snprintf(hub_dev, sizeof hub_dev, "n%d", k);
        int node = open_tap(node_ns, "pccl0"), hub = open_tap(hub_ns, hub_dev);
        lines[2 * k] = (struct line){.in = node, .out = hub, .last_due = -INFINITY};
        lines[2 * k + 1] = (struct line){.in = hub, .out = node, .last_due = -INFINITY};
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ep < 0 || timer < 0) die("cannot make its epoll or timer", NULL);
    for (int i = 0; i <= n; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, i < n ? lines[i].in : timer, &ev) != 0) die("epoll_ctl", NULL);
    }
    write_pid(state, "relay.ready");  /* stays in the hub's namespace: `ip netns pids <prefix>-hub` lists it */
    printf("relay %s (C): %d links, round trip %s (+- %s)\n", prefix, nodes, delay_text, jitter_text);
    fflush(stdout);
    static unsigned char buf[READ_SIZE];
    struct epoll_event events[2 * MAX_LINKS + 1];
    for (;;) {
        arm(timer, lines, n);
        int ready = epoll_wait(ep, events, 2 * MAX_LINKS + 1, -1);
        if (ready < 0 && errno != EINTR) die("epoll_wait", NULL);
        double now = now_s();
        for (int e = 0; e < ready; e++) {
            uint32_t i = events[e].data.u32;
            if ((int)i == n) {
                uint64_t expirations;
                if (read(timer, &expirations, sizeof expirations) < 0) { /* not yet: spurious */ }
                continue;
            }
            for (int r = 0; r < READS_PER_ROUND; r++) {
                ssize_t got = read(lines[i].in, buf, sizeof buf);
                if (got < 0 && errno != EAGAIN && errno != EINTR) die("lost a TAP device (its testbed removed?)", NULL);
                if (got <= 0) break;
                hold(&lines[i], buf, (size_t)got, now, delay, jitter, limit);
            }
        }
        now = now_s();
        for (int i = 0; i < n; i++) send_due(&lines[i], now);
    }
}
