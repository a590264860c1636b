#!/usr/bin/env bash
# The CLI end to end: exit codes and messages for good and bad input.
#   cli_test.sh path/to/dsv4 source_dir
set -u
dsv4=$1
src=$2
model=$src/tests/fixtures/models/tiny-flash
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0; passes=0

# expect NAME EXIT_CODE PATTERN -- command...
expect() {
  local name=$1 code=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL $name: exit $rc (want $code), output:"; echo "$out" | head -5
    failures=$((failures + 1))
  else
    passes=$((passes + 1))
  fi
}

expect inspect 0 "layer schedule" -- "$dsv4" inspect --model "$model"
expect generate 0 "decode:" -- "$dsv4" generate --model "$model" --prompt-ids "0, 5, 9" --max-tokens 4
expect generate_greedy_is_deterministic 0 "" -- bash -c "[ \"\$('$dsv4' generate --model '$model' --prompt-ids '1,2,3' --max-tokens 6 2>/dev/null)\" = \"\$('$dsv4' generate --model '$model' --prompt-ids '1,2,3' --max-tokens 6 2>/dev/null)\" ]"
echo '{"tokens": [0, 1, 2, 3]}' > "$tmp/t.json"
expect logits 0 "4 x 256 float32" -- "$dsv4" logits --model "$model" --input "$tmp/t.json" --output "$tmp/l.bin"
expect logits_size 0 "" -- test "$(stat -c %s "$tmp/l.bin")" -eq $((4 * 256 * 4))
expect bench 0 "context  prefill t/s" -- "$dsv4" bench --model "$model" --prompt-lens 8 --contexts 16 --decode-tokens 2 --json "$tmp/b.jsonl"
expect bench_json_lines 0 "" -- test "$(grep -c '"phase":' "$tmp/b.jsonl")" -eq 2
expect bench_needs_one_model 2 "exactly one of --model" -- "$dsv4" bench --model "$model" --synthetic v4-flash

expect missing_folder 3 "not a checkpoint folder" -- "$dsv4" inspect --model "$tmp/nope"
expect token_out_of_vocab 2 "token 300 at position 1: outside the vocabulary" -- "$dsv4" generate --model "$model" --prompt-ids "1, 300"
expect bad_token_list 2 "'x7' is not a token id" -- "$dsv4" generate --model "$model" --prompt-ids "1, x7"
echo '{"tokens": [1, -4]}' > "$tmp/bad.json"
expect bad_tokens_json 2 "tokens\[1\] = -4 is not a token id" -- "$dsv4" logits --model "$model" --input "$tmp/bad.json" --output "$tmp/x"
expect bad_numerics 2 "numerics 'fast'" -- "$dsv4" logits --model "$model" --input "$tmp/t.json" --output "$tmp/x" --numerics fast

# A damaged copy of the fixture: truncated shard, then a config with a missing field.
cp -r "$model" "$tmp/m"
truncate -s 1000000 "$tmp/m/model-00002-of-00003.safetensors"
expect truncated_shard 2 "model-00002-of-00003.safetensors: .*overrun the data section" -- "$dsv4" inspect --model "$tmp/m"
cp "$model/model-00002-of-00003.safetensors" "$tmp/m/"
python3 - "$tmp/m/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); del c["index_topk"]; json.dump(c, open(sys.argv[1], "w"))
PY
expect missing_field 2 "config.json: missing field 'index_topk'" -- "$dsv4" inspect --model "$tmp/m"
echo '{"model_type": "deepseek_v4",' > "$tmp/m/config.json"
expect malformed_config 2 "config.json: malformed JSON" -- "$dsv4" inspect --model "$tmp/m"

echo "cli: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
