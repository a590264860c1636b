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
expect generate_speculative 0 "drafts accepted" -- "$dsv4" generate --model "$model" --prompt-ids "0, 5, 9" --max-tokens 4 --speculative
expect generate_speculative_same_tokens 0 "" -- bash -c "[ \"\$('$dsv4' generate --model '$model' --prompt-ids '1,2,3' --max-tokens 12 --temperature 0.7 --seed 3 2>/dev/null)\" = \"\$('$dsv4' generate --model '$model' --prompt-ids '1,2,3' --max-tokens 12 --temperature 0.7 --seed 3 --speculative 2>/dev/null)\" ]"
echo '{"tokens": [0, 1, 2, 3]}' > "$tmp/t.json"
expect logits 0 "4 x 256 float32" -- "$dsv4" logits --model "$model" --input "$tmp/t.json" --output "$tmp/l.bin"
expect logits_size 0 "" -- test "$(stat -c %s "$tmp/l.bin")" -eq $((4 * 256 * 4))
expect bench 0 "context  prefill t/s" -- "$dsv4" bench --model "$model" --prompt-lens 8 --contexts 16 --decode-tokens 2 --json "$tmp/b.jsonl"
expect bench_json_lines 0 "" -- test "$(grep -c '"phase":' "$tmp/b.jsonl")" -eq 2
expect bench_batch 0 "decode batch 3" -- "$dsv4" bench --model "$model" --prompt-lens none --contexts 16 --decode-tokens 2 --batch 3 --json "$tmp/b3.jsonl"
expect bench_batch_json 0 "" -- grep -q '"batch":3' "$tmp/b3.jsonl"
expect bench_batch_positive 2 "batch" -- "$dsv4" bench --model "$model" --batch 0
expect bench_speculative 0 "speculative at 16: draft" -- "$dsv4" bench --model "$model" --prompt-lens none --contexts 16 --decode-tokens 2 --speculative
expect bench_speculative_batch_1 2 "batch 1 only" -- "$dsv4" bench --model "$model" --batch 2 --speculative
# --resume: a prefill over runs. The first pauses after one piece (4 chunks of 8 tokens), the
# second finishes and decodes; the files are gone after it.
resume=("$dsv4" bench --model "$model" --prompt-lens 64 --contexts 64 --decode-tokens 2 --chunk 8 --resume "$tmp/r.state" --time-limit 1e-9)
expect bench_resume_pauses 0 "paused after 32 of 64 tokens" -- "${resume[@]}"
expect bench_resume_saves 0 "" -- test -s "$tmp/r.state" -a -s "$tmp/r.state.progress"
expect bench_resume_refuses_another_prompt 2 "r.state: its 32 tokens are not a strict prefix" -- "${resume[@]}" --seed 2
expect bench_resume_finishes 0 "32 of 64 prompt tokens done in 1 runs" -- "${resume[@]}" --json "$tmp/r.jsonl"
expect bench_resume_reports_runs 0 "" -- grep -q '"phase":"prefill".*"runs":2' "$tmp/r.jsonl"
expect bench_resume_cleans_up 0 "" -- test ! -e "$tmp/r.state" -a ! -e "$tmp/r.state.progress"
expect bench_time_limit_needs_resume 2 "give --resume FILE" -- "$dsv4" bench --model "$model" --time-limit 5
expect bench_time_limit_not_negative 2 "at least 0" -- "$dsv4" bench --model "$model" --resume "$tmp/n.state" --time-limit -1
expect bench_needs_one_model 2 "exactly one of --model" -- "$dsv4" bench --model "$model" --synthetic v4-flash

# --prompt-cache: a repeated prompt resumes one token before its end and decodes the same tokens as
# a run without the cache; a longer prompt resumes there too; a prompt that does not extend the
# file ignores it; a file for other numerics, or not a state file, is refused naming the file.
cache=$tmp/prompt.state
# cached OUT ARGS...: generate with the cache, the tokens to $tmp/OUT (stderr for expect to match)
cached() { local out=$1; shift; "$dsv4" generate --model "$model" --max-tokens 6 --prompt-cache "$cache" "$@" > "$tmp/$out"; }
"$dsv4" generate --model "$model" --max-tokens 6 --prompt-ids "3,1,4,1,5,9" > "$tmp/uncached.out" 2>/dev/null
expect prompt_cache_first 0 "reused 0 of 6 prompt tokens" -- cached first.out --prompt-ids 3,1,4,1,5,9
expect prompt_cache_repeat 0 "reused 5 of 6 prompt tokens" -- cached repeat.out --prompt-ids 3,1,4,1,5,9
expect prompt_cache_same_output 0 "" -- cmp "$tmp/uncached.out" "$tmp/first.out"
expect prompt_cache_same_output_resumed 0 "" -- cmp "$tmp/uncached.out" "$tmp/repeat.out"
expect prompt_cache_longer 0 "reused 5 of 8 prompt tokens" -- cached longer.out --prompt-ids 3,1,4,1,5,9,2,6
expect prompt_cache_not_prefix 0 "its 7 tokens are not a prefix of this prompt's 4; not used" -- cached other.out --prompt-ids 2,7,1,8
expect prompt_cache_other_numerics 2 "$cache: saved for another model, numerics or state layout: numerics deepseek in the file, plain here; state layout compact in the file, f32 here" -- cached x.out --prompt-ids 2,7,1,8 --numerics plain
echo "not a state" > "$cache"
expect prompt_cache_not_state_file 2 "$cache: not a dsv4 state file" -- cached x.out --prompt-ids 2,7,1,8

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
