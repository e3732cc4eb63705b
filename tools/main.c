/* gemma4: the command line tool. main() picks a subcommand from the table
 * below; each lives in its own tools/cmd_NAME.c. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "gemma4.h"

int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_audio(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_grammar(int argc, char **argv);

const g4_command g4_commands[] = {
    {"run", cmd_run, "answer one prompt (text, images, audio), streamed"},
    {"chat", cmd_chat, "interactive conversation that keeps its KV cache between turns"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (chat, completions, streaming, batching)"},
    {"logits", cmd_logits, "logits of a token sequence to a safetensors file (verification)"},
    {"generate", cmd_generate, "greedy continuation of token ids (verification)"},
    {"info", cmd_info, "architecture, layer plan, parameters and weight bytes of a model"},
    {"perplexity", cmd_perplexity, "perplexity of a text; KL divergence and top-1 agreement against a saved run"},
    {"bench", cmd_bench, "prefill and decode speed beside this machine's limits"},
    {"pull", cmd_pull, "download a model from the Hugging Face hub into the local cache"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"audio", cmd_audio, "decode an audio file and show or save the model's audio input"},
    {"grammar", cmd_grammar, "compile a JSON schema / GBNF / regex constraint, check texts, time token masks"},
    {"synth", cmd_synth, "write a full-size checkpoint with random weights (loading and memory tests)"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4 <command> [options]\n\ncommands:\n");
    for (const g4_command *c = g4_commands; c->name; c++) fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "\nRun `gemma4 <command> --help` for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (const g4_command *c = g4_commands; c->name; c++)
        if (!strcmp(argv[1], c->name)) return c->run(argc - 1, argv + 1);
    fprintf(stderr, "gemma4: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
