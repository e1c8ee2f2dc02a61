/*
 * The floor for scripts/bench (docs/performance.md): the least work any decoder of a btsnoop
 * capture of advertising reports must do. It reads the file into memory (not timed), then,
 * timed, walks every record, and for each LE Meta advertising event (Core 5.4, Vol 4, Part E,
 * §7.7.65.2 legacy, §7.7.65.13 extended) walks its reports and each report's AD structures
 * (Core 5.4, Vol 3, Part C, §11), summing AD types and lengths so the compiler cannot drop
 * the walk. It checks lengths only as far as needed not to read past the buffer; it decodes
 * nothing, classifies nothing, counts nothing per kind.
 *
 *   cc -O2 -o cwalk cwalk.c && ./cwalk capture.btsnoop [runs]
 * Prints one JSON object: reports, AD structures, best seconds, reports per second.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct walk {
    uint64_t records, reports, structures, sum;
};

static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Walks the AD structures of one report's data. */
static inline void walk_ad(const uint8_t *d, size_t n, struct walk *w) {
    size_t i = 0;
    while (i < n) {
        uint8_t len = d[i];
        if (len == 0 || len >= n - i) break; /* padding, or a structure past the end */
        w->structures++;
        w->sum += (uint64_t)d[i + 1] + len;
        i += (size_t)len + 1;
    }
}

/* One HCI event (after the H4 indicator): code, length, parameters. */
static inline void walk_event(const uint8_t *e, size_t n, struct walk *w) {
    if (n < 4 || e[0] != 0x3E || (size_t)e[1] + 2 != n) return;
    uint8_t sub = e[2];
    size_t count = e[3], at = 4;
    if (sub == 0x02) { /* legacy: type, addr type, addr(6), len, data, rssi */
        for (size_t k = 0; k < count; k++) {
            if (at + 10 > n) return;
            size_t len = e[at + 8];
            if (at + 10 + len > n) return;
            walk_ad(e + at + 9, len, w);
            w->reports++;
            at += 10 + len;
        }
    } else if (sub == 0x0D) { /* extended: 24-byte fixed part ending in data length, then data */
        for (size_t k = 0; k < count; k++) {
            if (at + 24 > n) return;
            size_t len = e[at + 23];
            if (at + 24 + len > n) return;
            walk_ad(e + at + 24, len, w);
            w->reports++;
            at += 24 + len;
        }
    }
}

static struct walk walk_file(const uint8_t *f, size_t n) {
    struct walk w = {0, 0, 0, 0};
    size_t at = 16; /* "btsnoop\0", version, datalink */
    while (at + 24 <= n) {
        uint32_t incl = be32(f + at + 4);
        at += 24;
        if (incl > n - at) break;
        w.records++;
        /* Datalink 1002: the packet starts with its H4 indicator; 0x04 is an event. */
        if (incl > 1 && f[at] == 0x04) walk_event(f + at + 1, incl - 1, &w);
        at += incl;
    }
    return w;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s capture.btsnoop [runs]\n", argv[0]);
        return 2;
    }
    int runs = argc > 2 ? atoi(argv[2]) : 5;
    if (runs < 1) runs = 1;
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) { perror(argv[1]); return 1; }
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc(size > 0 ? (size_t)size : 1);
    if (!buf || fread(buf, 1, (size_t)size, fp) != (size_t)size) { perror("read"); return 1; }
    fclose(fp);
    if (size < 16 || memcmp(buf, "btsnoop\0", 8) != 0 || be32(buf + 12) != 1002) {
        fprintf(stderr, "%s: not a btsnoop file of datalink 1002\n", argv[1]);
        return 1;
    }

    struct walk w = walk_file(buf, (size_t)size); /* warm-up */
    double best = 1e30;
    for (int r = 0; r < runs; r++) {
        double t0 = now();
        struct walk x = walk_file(buf, (size_t)size);
        double t = now() - t0;
        if (t < best) best = t;
        /* Every run must agree: this also keeps each run's result live. */
        if (x.reports != w.reports || x.sum != w.sum) { fprintf(stderr, "runs disagree\n"); return 1; }
    }
    printf("{\"decoder\": \"c-walk\", \"records\": %llu, \"reports\": %llu, \"structures\": %llu, "
           "\"checksum\": %llu, \"runs\": %d, \"best_seconds\": %.9f, \"reports_per_second\": %.1f}\n",
           (unsigned long long)w.records, (unsigned long long)w.reports, (unsigned long long)w.structures,
           (unsigned long long)w.sum, runs, best, (double)w.reports / best);
    free(buf);
    return 0;
}
