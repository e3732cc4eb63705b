#!/bin/bash
# Source on the GPU machine to use binaries built elsewhere (bench/make_prebuilt.sh):
#   . bench/cuda_prebuilt_env.sh .gpu/pre.tar.xz
# unpacks them to /tmp/g4-prebuilt, adds the carried libraries the machine
# lacks to LD_LIBRARY_PATH, unpacks the test fixtures and the tokenizers, and
# exports GEMMA4 (the CLI), TESTS (the test programs) and the G4_* variables
# the tests read (as ctest sets them).
pre=/tmp/g4-prebuilt
rm -rf "$pre" && mkdir -p "$pre/libx" "$pre/fixtures" && tar -xJf "$1" -C "$pre" || return 1
for f in "$pre"/lib/*; do
  ldconfig -p | grep -q "$(basename "$f") " || cp -a "$f" "$pre/libx/"
done
export LD_LIBRARY_PATH=$pre/libx:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for a in tests/fixtures/*.tar.xz; do tar -xJf "$a" -C "$pre/fixtures"; done
for a in tests/data/tokenizer/*.tar.xz; do tar -xJf "$a" -C "$pre/fixtures"; done
export GEMMA4=$pre/bin/gemma4 TESTS=$pre/bin G4_FIXTURES=$pre/fixtures G4_TEST_DATA=$PWD/tests/data G4_SOURCE=$PWD \
  G4_BIN=$pre/bin/gemma4 G4_TMP=/tmp/g4-tmp
mkdir -p "$G4_TMP"
echo "prebuilt commit $(cat "$pre/COMMIT"); carried libs used: $(ls "$pre/libx" | tr '\n' ' ')"
