/* memory_schedule.c: `hearth memory schedule --at HH:MM --model M` runs synthesis every
 * night: a systemd user timer (hearth-memory.timer + .service under
 * $XDG_CONFIG_HOME/systemd/user) where `systemctl --user` works, else a crontab line
 * tagged "# hearth-memory"; `unschedule` removes either. Changes nothing in the vault. */
#include "base/user_dirs.h"
#include "base/file.h"
#include "cli/cli.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CRON_TAG "# hearth-memory"

static void unit_dir(char *out, size_t cap) {
    char *p = user_path(NULL, USER_CONFIG, "systemd/user");
    snprintf(out, cap, "%s", p ? p : "./systemd/user");
    free(p);
}

static int systemd_usable(void) { return system("systemctl --user show-environment >/dev/null 2>&1") == 0; }

/* Single quotes for the shell (the crontab line), each ' as '\''. */
static void shell_quote(const char *s, char *out, size_t cap) {
    size_t o = 0;
    if (o + 1 < cap) out[o++] = '\'';
    for (; *s && o + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(out + o, "'\\''", 4);
            o += 4;
        } else
            out[o++] = *s;
    }
    if (o + 1 < cap) out[o++] = '\'';
    out[o] = 0;
}

/* Rewrites the crontab without our line, plus line when it is not NULL. */
static int cron_update(const char *line) {
    FILE *in = popen("crontab -l 2>/dev/null", "r");
    char tmp[] = "/tmp/hearth-crontab-XXXXXX";
    int fd = mkstemp(tmp);
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!out) {
        if (in) pclose(in);
        return -1;
    }
    char buf[8192];
    while (in && fgets(buf, sizeof buf, in))
        if (!strstr(buf, CRON_TAG)) fputs(buf, out);
    if (in) pclose(in);
    if (line) fprintf(out, "%s\n", line);
    fclose(out);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "crontab '%s'", tmp);
    int rc = system(cmd);
    unlink(tmp);
    return rc == 0 ? 0 : -1;
}

int cli_memory_schedule(const char *at, const char *model, const char *vault) {
    int hh, mm;
    char extra;
    if (!at || sscanf(at, "%d:%d%c", &hh, &mm, &extra) != 2 || hh < 0 || hh > 23 || mm < 0 || mm > 59) {
        fprintf(stderr, "hearth: memory schedule: --at HH:MM (24-hour), e.g. --at 03:00\n");
        return 2;
    }
    if (!model) {
        fprintf(stderr, "hearth: memory schedule: --model names the model the nightly synthesis runs\n");
        return 2;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        snprintf(exe, sizeof exe, "hearth");
    else
        exe[n] = 0;
    char *path = hearth_memory_path(&(hearth_memory_options){.path = vault});
    char qexe[4200], qmodel[4200], qvault[4200], cmd[13000];
    shell_quote(exe, qexe, sizeof qexe);
    shell_quote(model, qmodel, sizeof qmodel);
    shell_quote(path ? path : "", qvault, sizeof qvault);
    snprintf(cmd, sizeof cmd, "%s memory synthesize --model %s --vault %s", qexe, qmodel, qvault);
    hearth_free(path);
    if (systemd_usable()) {
        char dir[4096], file[4200];
        unit_dir(dir, sizeof dir);
        if (file_mkdirs(dir)) {
            fprintf(stderr, "hearth: memory schedule: cannot create %s: %s\n", dir, strerror(errno));
            return 1;
        }
        snprintf(file, sizeof file, "%s/hearth-memory.service", dir);
        FILE *f = fopen(file, "w");
        if (!f) return fprintf(stderr, "hearth: memory schedule: cannot write %s\n", file), 1;
        fprintf(f,
                "[Unit]\nDescription=hearth memory: nightly synthesis\n\n[Service]\nType=oneshot\n"
                "ExecStart=/bin/sh -c \"%s\"\n",
                cmd);
        fclose(f);
        snprintf(file, sizeof file, "%s/hearth-memory.timer", dir);
        if (!(f = fopen(file, "w"))) return fprintf(stderr, "hearth: memory schedule: cannot write %s\n", file), 1;
        fprintf(f,
                "[Unit]\nDescription=hearth memory: nightly synthesis at %02d:%02d\n\n[Timer]\n"
                "OnCalendar=*-*-* %02d:%02d:00\nPersistent=true\n\n[Install]\nWantedBy=timers.target\n",
                hh, mm, hh, mm);
        fclose(f);
        if (system("systemctl --user daemon-reload && systemctl --user enable --now hearth-memory.timer")) {
            fprintf(stderr, "hearth: memory schedule: systemctl --user could not enable hearth-memory.timer\n");
            return 1;
        }
        printf("scheduled: systemd user timer hearth-memory.timer, every day at %02d:%02d (%s)\n", hh, mm, dir);
        return 0;
    }
    char line[13200];
    snprintf(line, sizeof line, "%d %d * * * %s " CRON_TAG, mm, hh, cmd);
    if (cron_update(line)) {
        fprintf(stderr, "hearth: memory schedule: no systemd user session and crontab failed\n");
        return 1;
    }
    printf("scheduled: crontab, every day at %02d:%02d\n", hh, mm);
    return 0;
}

int cli_memory_unschedule(void) {
    int removed = 0;
    if (systemd_usable()) {
        system("systemctl --user disable --now hearth-memory.timer >/dev/null 2>&1");
        char dir[4096], file[4200];
        unit_dir(dir, sizeof dir);
        snprintf(file, sizeof file, "%s/hearth-memory.timer", dir);
        removed |= unlink(file) == 0;
        snprintf(file, sizeof file, "%s/hearth-memory.service", dir);
        removed |= unlink(file) == 0;
        system("systemctl --user daemon-reload >/dev/null 2>&1");
    }
    FILE *in = popen("crontab -l 2>/dev/null", "r");
    char buf[8192];
    int in_cron = 0;
    while (in && fgets(buf, sizeof buf, in)) in_cron |= strstr(buf, CRON_TAG) != NULL;
    if (in) pclose(in);
    if (in_cron && cron_update(NULL) == 0) removed = 1;
    printf(removed ? "unscheduled\n" : "nothing was scheduled\n");
    return 0;
}
