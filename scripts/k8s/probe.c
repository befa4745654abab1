/* tern's network probe for the lab's Kubernetes tests: what busybox cannot do (its nc has no
 * UDP here, and no way to time a transfer).
 *
 *   probe serve-udp PORT        answer every datagram with this host's name (the pod's name)
 *   probe udp IP PORT           send a datagram, print the answer (3 tries, 1 s each)
 *   probe sink PORT             TCP: read and discard every connection's bytes
 *   probe send IP PORT BYTES    TCP: send BYTES, print "BYTES bytes in MS ms (KBIT kbit/s)"
 *
 * Servers exit 0 on SIGTERM/SIGINT (they run as PID 1 of a container, where the default
 * action of SIGTERM does not apply). Build: gcc -static -Os -o probe probe.c
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static void servers_exit_on_term(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* Reap finished sink children automatically. */
    signal(SIGCHLD, SIG_IGN);
}

static int parse_port(const char *s) {
    char *end;
    long p = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || p < 1 || p > 65535) {
        fprintf(stderr, "probe: invalid port %s (1-65535)\n", s);
        exit(2);
    }
    return (int)p;
}

static struct sockaddr_in addr_of(const char *ip, int port) {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    if (ip == NULL) {
        a.sin_addr.s_addr = htonl(INADDR_ANY);
    } else if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        fprintf(stderr, "probe: invalid IPv4 address %s\n", ip);
        exit(2);
    }
    return a;
}

static int bound(int type, int port) {
    int fd = socket(AF_INET, type, 0);
    int one = 1;
    struct sockaddr_in a = addr_of(NULL, port);
    if (fd < 0) {
        perror("probe: socket");
        exit(1);
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("probe: bind");
        exit(1);
    }
    return fd;
}

static int serve_udp(int port) {
    char host[256] = {0}, buf[2048];
    int fd = bound(SOCK_DGRAM, port);
    servers_exit_on_term();
    gethostname(host, sizeof host - 1);
    for (;;) {
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&peer, &len);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("probe: recvfrom");
            return 1;
        }
        sendto(fd, host, strlen(host), 0, (struct sockaddr *)&peer, len);
    }
}

static int udp(const char *ip, int port) {
    struct sockaddr_in a = addr_of(ip, port);
    struct timeval tv = {1, 0};
    char buf[2048];
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("probe: udp socket");
        return 1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < 3; i++) {
        if (send(fd, "ping", 4, 0) < 0) {
            perror("probe: send");
            continue;
        }
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n > 0) {
            buf[n] = '\0';
            printf("%s\n", buf);
            return 0;
        }
    }
    fprintf(stderr, "probe: no UDP answer from %s:%d\n", ip, port);
    return 1;
}

static int sink(int port) {
    char buf[65536];
    int fd = bound(SOCK_STREAM, port);
    servers_exit_on_term();
    if (listen(fd, 64) < 0) {
        perror("probe: listen");
        return 1;
    }
    for (;;) {
        int c = accept(fd, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR) continue;
            perror("probe: accept");
            return 1;
        }
        pid_t pid = fork();
        if (pid == 0) {
            while (read(c, buf, sizeof buf) > 0) {
            }
            _exit(0);
        }
        close(c);
    }
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int send_bytes(const char *ip, int port, const char *count) {
    char *end;
    long long total = strtoll(count, &end, 10), sent = 0;
    static char buf[65536];
    struct sockaddr_in a = addr_of(ip, port);
    if (*count == '\0' || *end != '\0' || total < 1 || total > (1LL << 34)) {
        fprintf(stderr, "probe: invalid byte count %s (1 to 2^34)\n", count);
        return 2;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("probe: connect");
        return 1;
    }
    double t0 = now_ms();
    while (sent < total) {
        long long want = total - sent;
        ssize_t n = write(fd, buf, want < (long long)sizeof buf ? (size_t)want : sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("probe: write");
            return 1;
        }
        sent += n;
    }
    /* Wait until the peer has everything: it closes after reading EOF. */
    shutdown(fd, SHUT_WR);
    while (read(fd, buf, sizeof buf) > 0) {
    }
    double ms = now_ms() - t0;
    printf("%lld bytes in %.0f ms (%.0f kbit/s)\n", sent, ms, ms > 0 ? sent * 8.0 / ms : 0.0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "serve-udp") == 0) return serve_udp(parse_port(argv[2]));
    if (argc == 4 && strcmp(argv[1], "udp") == 0) return udp(argv[2], parse_port(argv[3]));
    if (argc == 3 && strcmp(argv[1], "sink") == 0) return sink(parse_port(argv[2]));
    if (argc == 5 && strcmp(argv[1], "send") == 0)
        return send_bytes(argv[2], parse_port(argv[3]), argv[4]);
    fprintf(stderr,
            "usage: probe serve-udp PORT | udp IP PORT | sink PORT | send IP PORT BYTES\n");
    return 2;
}
