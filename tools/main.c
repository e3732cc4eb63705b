/* gemma4: the command line tool. One main, one function per subcommand. */
#include <stdio.h>
#include <string.h>

#include "gemma4.h"

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: gemma4 <command> [options]\n");
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "gemma4: unknown command '%s'\n", argv[1]);
    return 2;
}
