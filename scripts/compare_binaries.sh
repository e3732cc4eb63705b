#!/bin/bash
# Runs two gemma4 binaries on the same inputs and compares their outputs byte
# for byte: logits (prefill, --decode, --hidden, images, audio, fast/bf16),
# generate (exact, fast, drafted, errors), run (greedy, seeds, --json,
# --regex, --json-schema, --raw, drafted), chat (turns and /reset),
# perplexity (text, --json, --save-logits, --kl-divergence), tokenize and
# info's model summary on the vendored fixtures and the bundled model. The
# speeds on run's and chat's timing lines are masked (they differ between
# two runs of one binary).
# Usage: scripts/compare_binaries.sh OLD_BIN NEW_BIN BUILD_DIR (BUILD_DIR holds fixtures/ and models/)
set -u
OLD=$1 NEW=$2 BUILD=$3
FIX=$BUILD/fixtures MODEL=$BUILD/models/tiny DATA=$(dirname "$0")/../tests/data
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
same=0 differ=0

ids() { python3 -c "import json,sys; r=json.load(open('$FIX/$1/ref.json')); print(','.join(map(str, r['$2']['$3'])))"; }

# compare NAME ARGS...: both binaries with ARGS ("@OUT@" is each run's output file)
compare() {
    local name=$1
    shift
    local a=() b=()
    for x in "$@"; do a+=("${x//@OUT@/$TMP/old.out}"); b+=("${x//@OUT@/$TMP/new.out}"); done
    rm -f "$TMP/old.out" "$TMP/new.out"
    "$OLD" "${a[@]}" <"${STDIN:-/dev/null}" >"$TMP/old.stdout" 2>"$TMP/old.stderr"
    local rc_old=$?
    "$NEW" "${b[@]}" <"${STDIN:-/dev/null}" >"$TMP/new.stdout" 2>"$TMP/new.stderr"
    local rc_new=$?
    sed -i "s|$TMP/old.out|OUT|g" "$TMP/old.stdout" "$TMP/old.stderr"
    sed -i "s|$TMP/new.out|OUT|g" "$TMP/new.stdout" "$TMP/new.stderr"
    # info's lines on this machine's memory now (the CPU's budget, the resident set) differ between two runs
    # of one binary
    sed -i -E '/^memory       peak RSS |^             within [0-9.]+ GiB: /d' "$TMP/old.stdout" "$TMP/new.stdout"
    sed -i -E 's/[0-9.]+ tok\/s/N tok\/s/g; s/[0-9.]+ ms drafting, [0-9.]+ ms verifying/N ms drafting, N ms verifying/' \
        "$TMP/old.stderr" "$TMP/new.stderr"
    if [ $rc_old -eq $rc_new ] && cmp -s "$TMP/old.stdout" "$TMP/new.stdout" && cmp -s "$TMP/old.stderr" "$TMP/new.stderr" &&
        { [ ! -e "$TMP/old.out" ] || cmp -s "$TMP/old.out" "$TMP/new.out"; }; then
        same=$((same + 1))
        echo "same    $name (exit $rc_old$( [ -e "$TMP/old.out" ] && echo ", $(stat -c %s "$TMP/old.out") bytes written"))"
    else
        differ=$((differ + 1))
        echo "DIFFER  $name (exit $rc_old vs $rc_new)"
        diff "$TMP/old.stdout" "$TMP/new.stdout" | head -5
        diff "$TMP/old.stderr" "$TMP/new.stderr" | head -5
    fi
}

for f in dense moe e2b realdims unified dense-mlx8 moe-mlx4 moe-mxfp4 e2b-mlx4; do
    all=$(ids $f text all_ids)
    compare "logits $f" logits -m "$FIX/$f" --ids "$all" -o @OUT@ --device cpu
    compare "logits $f --decode" logits -m "$FIX/$f" --ids "$all" -o @OUT@ --device cpu --decode
    compare "logits $f --hidden" logits -m "$FIX/$f" --ids "$all" -o @OUT@ --device cpu --hidden
    compare "info $f" info -m "$FIX/$f" --device cpu
done
compare "logits dense fast bf16" logits -m "$FIX/dense" --ids "$(ids dense text all_ids)" -o @OUT@ --device cpu \
    --precision fast --kv-type bf16
compare "logits dense fp8" logits -m "$FIX/dense" --ids "$(ids dense text all_ids)" -o @OUT@ --device cpu --kv-type fp8
for f in dense e2b unified; do
    compare "logits $f image" logits -m "$FIX/$f" --ids "$(ids $f image prompt_ids)" --image "$FIX/$f/image.png" \
        -o @OUT@ --device cpu
done
compare "logits unified image causal" logits -m "$FIX/unified" --ids "$(ids unified image prompt_ids)" \
    --image "$FIX/unified/image.png" --vision-mask causal -o @OUT@ --device cpu
for f in e2b unified; do
    compare "logits $f audio" logits -m "$FIX/$f" --ids "$(ids $f audio prompt_ids)" --audio "$FIX/$f/audio.wav" \
        -o @OUT@ --device cpu
done
compare "logits --decode with an image (refused)" logits -m "$FIX/dense" --ids "$(ids dense image prompt_ids)" \
    --image "$FIX/dense/image.png" --decode -o @OUT@ --device cpu
compare "logits bad id" logits -m "$FIX/dense" --ids 1,x -o @OUT@
compare "logits id past the vocabulary" logits -m "$FIX/dense" --ids 2,999999 -o @OUT@ --device cpu
compare "logits bad --vision-mask" logits -m "$FIX/dense" --ids 2,3 --vision-mask sideways -o @OUT@
compare "logits bad --kv-type" logits -m "$FIX/dense" --ids 2,3 --kv-type f16 -o @OUT@
compare "logits missing model" logits -m /nonexistent --ids 2,3 -o @OUT@ --device cpu

for f in dense moe e2b unified dense-mlx8 moe-mlx4 moe-mxfp4 e2b-mlx4; do
    prompt=$(ids $f text prompt_ids)
    compare "generate $f" generate -m "$FIX/$f" --ids "$prompt" -n 12 --device cpu
    compare "generate $f fast" generate -m "$FIX/$f" --ids "$prompt" -n 12 --device cpu --precision fast
done
compare "generate dense --ignore-eos bf16" generate -m "$FIX/dense" --ids "$(ids dense text prompt_ids)" -n 24 \
    --ignore-eos --device cpu --kv-type bf16
for k in 1 4; do
    compare "generate dense --draft-max $k" generate -m "$FIX/dense" --ids "$(ids dense text prompt_ids)" -n 16 \
        --ignore-eos --device cpu --draft "$FIX/dense-assistant" --draft-max $k
done
compare "generate e2b --draft" generate -m "$FIX/e2b" --ids "$(ids e2b text prompt_ids)" -n 16 --device cpu \
    --draft "$FIX/e2b-assistant" --draft-max 2
compare "generate tiny" generate -m "$MODEL" --ids 2,818,506,4034,1091,1114 -n 48 --device cpu
compare "generate tiny fast" generate -m "$MODEL" --ids 2,818,506,4034,1091,1114 -n 48 --device cpu --precision fast
compare "generate tiny --draft auto" generate -m "$MODEL" --ids 2,818,506,4034,1091,1114 -n 48 --ignore-eos \
    --device cpu --draft auto --draft-max 3
compare "generate tiny fast --draft" generate -m "$MODEL" --ids 2,818,506,4034,1091,1114 -n 48 --ignore-eos \
    --device cpu --precision fast --draft "$MODEL-assistant"
compare "generate -n 0" generate -m "$FIX/dense" --ids 2,3 -n 0 --device cpu
compare "generate bad id" generate -m "$FIX/dense" --ids 2,x -n 4
compare "generate id past the vocabulary" generate -m "$FIX/dense" --ids 2,999999 -n 4 --device cpu
compare "generate empty ids" generate -m "$FIX/dense" --ids , -n 4
compare "generate bad --draft-max" generate -m "$FIX/dense" --ids 2,3 -n 4 --draft "$FIX/dense-assistant" --draft-max 17
# (the old binary said "gemma4: PATH: no such file..." without "cannot load model: ", which g4_open's callers print)
"$NEW" generate -m /nonexistent --ids 2,3 -n 4 --device cpu 2>"$TMP/new.stderr"
if [ $? -eq 1 ] && grep -q "^gemma4: cannot load model: /nonexistent: no such file" "$TMP/new.stderr"; then
    same=$((same + 1)) && echo "changed generate missing model: exit 1, $(cat "$TMP/new.stderr")"
else
    differ=$((differ + 1)) && echo "DIFFER  generate missing model"
fi

compare "run greedy" run -m "$MODEL" -p "And God said" -n 40 --temp 0 --device cpu
compare "run exact greedy" run -m "$MODEL" -p "Who is the king of glory?" -n 40 --temp 0 --device cpu --precision exact
for seed in 1 7; do
    compare "run sampled seed $seed" run -m "$MODEL" -p "In the beginning" -n 40 --seed $seed --device cpu
done
compare "run top-k min-p penalties" run -m "$MODEL" -p "The Lord is my shepherd" -n 40 --seed 3 --top-k 20 \
    --min-p 0.05 --repeat-penalty 1.3 --presence-penalty 0.5 --frequency-penalty 0.2 --device cpu
compare "run --system --think" run -m "$MODEL" --system "Answer briefly." -p "Who was Moses?" --think -n 40 --temp 0 \
    --device cpu
compare "run --raw" run -m "$MODEL" --raw -p "And the earth was" -n 32 --temp 0 --device cpu
compare "run --json" run -m "$MODEL" -p "Describe Abraham as JSON" -n 48 --json --temp 0 --device cpu
compare "run --json sampled" run -m "$MODEL" -p "Describe Noah as JSON" -n 48 --json --seed 5 --device cpu
compare "run --regex" run -m "$MODEL" -p "Name a book" -n 24 --regex '[A-Z][a-z]+ [0-9]+:[0-9]+' --temp 0 --device cpu
printf '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}' \
    >"$TMP/schema.json"
compare "run --json-schema" run -m "$MODEL" -p "Who was Isaac?" -n 48 --json-schema "$TMP/schema.json" --temp 0 \
    --device cpu
compare "run --draft greedy" run -m "$MODEL" -p "And God said" -n 40 --temp 0 --device cpu --draft "$MODEL-assistant" \
    --draft-max 3
compare "run --draft sampled" run -m "$MODEL" -p "And God said" -n 40 --seed 2 --device cpu --draft "$MODEL-assistant"
compare "run --draft with --json" run -m "$MODEL" -p "And God said" -n 24 --json --temp 0 --device cpu \
    --draft "$MODEL-assistant"
compare "run bad schema file" run -m "$MODEL" -p "x" --json-schema /nonexistent.json
# (the old binary printed the compiler's message twice, "gemma4: ..." and "gemma4 run: ...")
"$NEW" run -m "$MODEL" -p "x" -n 4 --regex '[a-' --device cpu >"$TMP/new.stdout" 2>"$TMP/new.stderr"
if [ $? -eq 1 ] && [ ! -s "$TMP/new.stdout" ] &&
    [ "$(cat "$TMP/new.stderr")" = "gemma4 run: regex: unterminated character class at offset 3" ]; then
    same=$((same + 1)) && echo "changed run bad regex: exit 1, $(cat "$TMP/new.stderr")"
else
    differ=$((differ + 1)) && echo "DIFFER  run bad regex"
fi
compare "run no tokenizer" run -m "$FIX/dense" -p "x" -n 4 --device cpu
compare "run bad --temp" run -m "$MODEL" -p "x" --temp hot
# a fixture with the tiny tokenizer and the model's chat template (as test_server_openai's model folders), for
# images and audio through run and chat
for f in dense e2b; do
    mkdir -p "$TMP/$f-chat"
    for x in config.json model.safetensors generation_config.json; do ln -s "$(realpath "$FIX/$f/$x")" "$TMP/$f-chat/$x"; done
    cp "$DATA/tiny_tokenizer/tokenizer.json" "$TMP/$f-chat/"
done
cp "$DATA/chat/templates/gemma-4-31B-it.chat_template.jinja" "$TMP/dense-chat/chat_template.jinja"
cp "$DATA/chat/templates/gemma-4-E2B-it.chat_template.jinja" "$TMP/e2b-chat/chat_template.jinja"
compare "run dense --image" run -m "$TMP/dense-chat" -p "Describe it" --image "$FIX/dense/image.png" -n 8 --temp 0 \
    --device cpu --precision exact
compare "run e2b --image --image-tokens 70 --audio" run -m "$TMP/e2b-chat" -p "What is this?" --image "$FIX/e2b/image.png" \
    --image-tokens 70 --audio "$FIX/e2b/audio.wav" -n 8 --temp 0 --device cpu
compare "run e2b --raw with an image" run -m "$TMP/e2b-chat" --raw -p "<|image|> and" --image "$FIX/e2b/image.png" -n 6 \
    --temp 0 --device cpu
printf '/image %s\nDescribe it\nAnd again?\n' "$FIX/dense/image.png" >"$TMP/chat-image.txt"
STDIN="$TMP/chat-image.txt" compare "chat dense /image, two turns" chat -m "$TMP/dense-chat" -n 6 --temp 0 --device cpu
printf 'And God said\nWho is the king of glory?\n/reset\nIn the beginning\nAnd then?\n' >"$TMP/chat.txt"
STDIN="$TMP/chat.txt" compare "chat greedy, 4 turns and /reset" chat -m "$MODEL" -n 24 --temp 0 --device cpu
STDIN="$TMP/chat.txt" compare "chat sampled --think" chat -m "$MODEL" -n 24 --seed 4 --think --device cpu
STDIN="$TMP/chat.txt" compare "chat --draft" chat -m "$MODEL" -n 24 --temp 0 --device cpu --draft "$MODEL-assistant"
printf 'And God said\n/think on\nWho was Moses?\n' >"$TMP/chat2.txt"
STDIN="$TMP/chat2.txt" compare "chat /think on, --system" chat -m "$MODEL" -n 24 --temp 0 --system "Be brief." \
    --device cpu --precision exact

head -c 6000 "$DATA/kjv_heldout.txt" >"$TMP/text.txt"
compare "perplexity --json" perplexity -m "$MODEL" -f "$TMP/text.txt" --device cpu --ctx 128 --json
compare "perplexity exact --stride --save-logits" perplexity -m "$MODEL" -f "$TMP/text.txt" --device cpu --ctx 128 \
    --stride 64 --precision exact --save-logits @OUT@
"$OLD" perplexity -m "$MODEL" -f "$TMP/text.txt" --device cpu --ctx 128 --precision exact --save-logits "$TMP/base.st" >/dev/null
compare "perplexity --kl-divergence" perplexity -m "$MODEL" -f "$TMP/text.txt" --device cpu --ctx 128 \
    --kl-divergence "$TMP/base.st"
compare "perplexity --kl-divergence another ctx" perplexity -m "$MODEL" -f "$TMP/text.txt" --device cpu --ctx 64 \
    --kl-divergence "$TMP/base.st"
# (the old binary crashed here: it resolved the KV type on the context it had failed to open)
"$NEW" perplexity -m "$FIX/dense" -f "$TMP/text.txt" --device cpu 2>"$TMP/new.stderr"
if [ $? -eq 1 ] && grep -q "has no tokenizer.json" "$TMP/new.stderr"; then
    same=$((same + 1)) && echo "fixed   perplexity without a tokenizer: exit 1, $(cat "$TMP/new.stderr")"
else
    differ=$((differ + 1)) && echo "DIFFER  perplexity without a tokenizer"
fi
compare "perplexity bad stride" perplexity -m "$MODEL" -f "$TMP/text.txt" --ctx 16 --stride 20

TOK=$FIX/tokenizer/tokenizer-gemma4-style.json
compare "tokenize --file" tokenize -m "$TOK" --file "$TMP/text.txt"
compare "tokenize --add-special" tokenize -m "$TOK" --text "<start_of_turn>user Hi" --add-special
compare "tokenize --plain" tokenize -m "$TOK" --text "<start_of_turn>user Hi" --plain
compare "tokenize folder" tokenize -m "$MODEL" --file "$TMP/text.txt"
compare "tokenize missing" tokenize -m /nonexistent --text x
compare "info tiny" info -m "$MODEL" --device cpu
echo "$same same, $differ differ"
[ $differ -eq 0 ]
