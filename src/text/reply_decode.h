/* Decoding generated ids for the chat reply parser: special tokens are
 * dropped except the markers that give a reply its structure (thought
 * channel, tool calls, string delimiters, end of turn), which the parser in
 * chat.h needs to see. */
#ifndef G4_TEXT_REPLY_DECODE_H
#define G4_TEXT_REPLY_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

g4_status g4_decode_reply(const g4_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len);

#endif
