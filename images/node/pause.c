/* The pod sandbox's pause process: sleeps until SIGINT/SIGTERM, reaps orphans (PID 1 of a pod). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void sigdown(int s) { (void)s; _exit(0); }
static void sigreap(int s) {
    (void)s;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction down = {.sa_handler = sigdown};
    struct sigaction reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &down, NULL);
    sigaction(SIGTERM, &down, NULL);
    sigaction(SIGCHLD, &reap, NULL);
    for (;;) pause();
}
