/* Subcommands of the gemma4 tool: each is `int cmd_NAME(int argc, char **argv)`
 * in tools/cmd_NAME.c, receiving argv[0] = "NAME" and returning the exit status
 * (0 ok, 1 failure, 2 usage error). */
#ifndef G4_TOOLS_COMMANDS_H
#define G4_TOOLS_COMMANDS_H

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} g4_command;

/* The table lives in main.c. */
extern const g4_command g4_commands[];

#endif
