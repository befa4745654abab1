/* tern's pod sandbox ("pause") process: PID 1 of every pod sandbox the lab's kubelets create.
 *
 * It holds the pod's namespaces open, reaps every child that is re-parented to it (SIGCHLD),
 * and exits 0 on SIGINT/SIGTERM so that `StopPodSandbox` is quick. It does what Kubernetes'
 * build/pause/linux/pause.c describes, written here so the lab needs no registry.
 * Build: gcc -static -Os -o pause pause.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "tern-pause-3.10"

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    /* Reap every exited child; more than one may be pending behind one signal. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        printf("%s\n", VERSION);
        return 0;
    }
    if (getpid() != 1) {
        /* Not fatal: it still works as a sleeper, but say so (as upstream does). */
        fprintf(stderr, "Warning: pause should be the first process\n");
    }
    struct sigaction term = {0};
    term.sa_handler = on_term;
    sigemptyset(&term.sa_mask);
    if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0) {
        perror("sigaction(SIGINT/SIGTERM)");
        return 1;
    }
    struct sigaction child = {0};
    child.sa_handler = on_child;
    sigemptyset(&child.sa_mask);
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    if (sigaction(SIGCHLD, &child, NULL) < 0) {
        perror("sigaction(SIGCHLD)");
        return 2;
    }
    for (;;) {
        pause();
    }
    return 42; /* unreachable */
}
