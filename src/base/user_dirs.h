/* user_dirs.h: where a user's files live. The one place hearth reads the variables
 * that say so: HOME (or the password database when it is unset), the XDG base
 * directories, and the documented overrides each caller names (HEARTH_CACHE,
 * HEARTH_WIKI, ...). Callers never read those variables themselves. */
#ifndef HEARTH_BASE_USER_DIRS_H
#define HEARTH_BASE_USER_DIRS_H

typedef enum user_base {
    USER_HOME,   /* $HOME */
    USER_CONFIG, /* $XDG_CONFIG_HOME, else ~/.config */
    USER_DATA,   /* $XDG_DATA_HOME, else ~/.local/share */
} user_base;

/* $override_env when it is set and not empty (override_env may be NULL), else
 * base/rel (rel may be NULL or ""). malloc'd; NULL when no home folder is known. */
char *user_path(const char *override_env, user_base base, const char *rel);

/* A documented setting read from the environment (HF_ENDPOINT, HF_TOKEN, ...):
 * given when it is set and not empty, else the variable, else NULL. */
const char *user_setting(const char *given, const char *env);
#endif
