/* The memory lines of `gemma4 info` and `gemma4 serve` (runtime/memory_plan.h). */
#ifndef G4_TOOLS_CLI_MEMORY_H
#define G4_TOOLS_CLI_MEMORY_H

#include <stdio.h>

#include "runtime/memory_plan.h"

/* KV bytes per token of the full and the sliding layers, the rings' fixed
 * cost, weights and working memory, and for each KV type (the chosen one
 * marked) the longest context of 1 and of 16 sequences within the budget
 * (g4_memory_budget of `fraction`). */
void cli_print_memory(FILE *f, const g4_model *m, g4_kv_type chosen, int chunk, double fraction);

#endif
