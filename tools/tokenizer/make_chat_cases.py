#!/usr/bin/env python3
"""Builds tests/tokenizer/data/chat_cases.jsonl: prompt-rendering cases with expected text and ids.

Expected text comes from DeepSeek's official encoder, encoding/encoding_dsv4.py of the
DeepSeek-V4-Flash repository (not part of this project; pass its path with --reference). Expected
ids are HF `tokenizers` on that text. Two kinds of case are derived rather than run directly:
  * -0731 effort cases: the preview encoder with no effort, plus the 0731 prefix table (§3.7) right
    after BOS — the only difference between the two encoders for text-only chats;
  * object-valued tool arguments: the reference is run with the same arguments as a JSON string,
    since it mis-renders objects (§3.4) and the engine deliberately does not.
Usage: python3 tools/tokenizer/make_chat_cases.py --reference /path/to/encoding_dsv4.py
"""
import argparse
import copy
import importlib.util
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from hf_reference import load_hf  # noqa: E402

BOS = "<｜begin▁of▁sentence｜>"
P_ABS = ("Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking "
         "and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic "
         "against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire "
         "deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis "
         "to ensure absolutely no assumption is left unchecked.\n\n")
P_BEYOND = ("Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\nYou MUST reason with "
            "the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into "
            "its most fundamental components, trace every causal chain to its root, and resolve the underlying cause "
            "rather than any surface symptom.\nDo not stop reasoning until you have independently verified the "
            "solution from multiple angles and are certain that no assumption remains unchecked and no error remains "
            "undiscovered.\n\n")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "days": {"type": "integer", "minimum": 1.0}},
                          "required": ["city"]}}}
CALC = {"type": "function", "function": {"name": "calc", "description": "Évalue une expression — 计算器\n\tline2\u0001",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}
NOARGS = {"type": "function", "function": {"name": "now", "description": "Current time", "parameters": {"type": "object", "properties": {}}}}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def cases():
    u = lambda t: {"role": "user", "content": t}  # noqa: E731
    a = lambda t, r=None: {"role": "assistant", "content": t, **({"reasoning_content": r} if r is not None else {})}  # noqa: E731
    sys_ = lambda t: {"role": "system", "content": t}  # noqa: E731
    yield "chat_single_user", [u("Hello!")], None, {}
    yield "thinking_single_user", [u("Why is the sky blue?")], None, {"thinking": True}
    yield "thinking_effort_max_preview", [sys_("Be brief."), u("Prove it.")], None, {"thinking": True, "effort": "max"}
    yield "thinking_effort_high_preview", [u("Prove it.")], None, {"thinking": True, "effort": "high"}
    for effort in ("low", "high", "max"):
        yield f"thinking_effort_{effort}_0731", [sys_("S"), u("Q")], None, {"thinking": True, "effort": effort, "variant": "0731"}
    yield "chat_effort_ignored", [u("Q")], None, {"effort": "max"}
    yield "chat_multi_turn_reasoning_ignored", [sys_("You are terse."), u("1+1?"), a("2", "easy"), u("2+2?")], None, {}
    yield "thinking_multi_turn_drops_reasoning", [u("A"), a("a1", "r1"), u("B"), a("b1", "r2"), u("C")], None, {"thinking": True}
    yield "thinking_multi_turn_keep_reasoning", [u("A"), a("a1", "r1"), u("B")], None, {"thinking": True, "drop_thinking": False}
    yield "thinking_last_assistant_keeps_reasoning", [u("A"), a("a1", "r1"), u("B"), a("b1", "r2")], None, {"thinking": True}
    yield "tools_without_system", [u("Weather in Paris?")], [WEATHER], {"thinking": True}
    yield "tools_chat_full_cycle", [
        sys_("You help."), u("Weather in Paris for 3 days?"),
        {"role": "assistant", "content": None, "reasoning_content": "need tool",
         "tool_calls": [call("c1", "get_weather", "{\"city\": \"Paris\", \"days\": 3}")]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21.5}"}, a("21.5 °C, sunny.")], [WEATHER], {}
    yield "tools_thinking_parallel_calls_sorted_results", [
        sys_("S"), u("Compare Paris and Oslo, then compute 2*3."),
        {"role": "assistant", "content": "Checking.", "reasoning_content": "three calls",
         "tool_calls": [call("a", "get_weather", "{\"city\": \"Paris\"}"), call("b", "get_weather", "{\"city\": \"Oslo\"}"),
                        call("c", "calc", "{\"expr\": \"2*3\"}")]},
        {"role": "tool", "tool_call_id": "c", "content": "6"}, {"role": "tool", "tool_call_id": "a", "content": "20"},
        {"role": "tool", "tool_call_id": "b", "content": "5"}, u("thanks, and summarise")], [WEATHER, CALC], {"thinking": True}
    yield "tool_call_without_arguments", [u("time?"), {"role": "assistant", "content": "", "tool_calls": [call("t", "now", "{}")]},
                                          {"role": "tool", "tool_call_id": "t", "content": "12:00"}], [NOARGS], {"thinking": True}
    yield "non_string_arguments", [u("go"), {"role": "assistant", "content": "", "tool_calls": [call(
        "x", "calc", "{\"n\": 3, \"f\": 1.0, \"g\": 2.5, \"tiny\": 1e-05, \"big\": 1e16, \"mid\": 123456789012345.0, "
        "\"neg\": -0.0, \"b\": true, \"z\": null, \"list\": [1, \"two\", [3]], \"obj\": {\"k\": \"v\", \"é\": \"ü\\n\"}, "
        "\"s\": \"line1\\nline2 \\\"q\\\" 中文\"}")]}], [CALC], {}
    yield "arguments_not_json", [u("go"), {"role": "assistant", "content": "", "tool_calls": [call("x", "calc", "2*3 (raw)")]}], [CALC], {}
    yield "arguments_as_object", [u("go"), {"role": "assistant", "content": "ok", "tool_calls": [
        call("x", "get_weather", {"city": "Oslo", "days": 2, "opts": {"metric": True}})]}], [WEATHER], {"thinking": True}
    yield "empty_contents", [sys_(""), u(""), a(""), u("")], None, {}
    yield "null_assistant_content_thinking", [u("x"), {"role": "assistant", "content": None, "reasoning_content": None}, u("y")], None, {"thinking": True}
    yield "unicode_everywhere", [sys_("Système 🌍 — 系统 — مرحبا — नमस्ते"), u("emoji 👨‍👩‍👧 e\u0301 ｜ full-width ＡＢＣ"),
                                 a("応答 🎉", "思考…"), u("Ελληνικά \u200d\u2028 end")], None, {"thinking": True}
    yield "response_format", [{"role": "system", "content": "Reply in JSON.", "response_format": {
        "type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"a": {"type": "number"}}}}}},
        u("give a")], None, {}
    yield "latest_reminder_then_user", [sys_("S"), {"role": "latest_reminder", "content": "2026-01-01,Paris,App,fr"}, u("Bonjour")], None, {"thinking": True}
    yield "developer_with_tools", [sys_("S"), {"role": "developer", "content": "Search this.", "tools": [WEATHER]},
                                   {"role": "assistant", "content": "", "reasoning_content": "r",
                                    "tool_calls": [call("q", "get_weather", "{\"city\": \"Rome\"}")]},
                                   {"role": "tool", "tool_call_id": "q", "content": "sunny"}], None, {"thinking": True}
    yield "task_query", [sys_("S"), {"role": "user", "content": "find flights", "task": "query"}, a("flights to Rome")], None, {}
    yield "task_action_thinking", [{"role": "user", "content": "do it", "task": "action"}, a("Search")], None, {"thinking": True}
    yield "assistant_prefill_wo_eos", [u("Write a haiku"), {"role": "assistant", "content": "Autumn moon", "wo_eos": True}], None, {}
    yield "tool_result_content_parts", [u("look"), {"role": "assistant", "content": "", "tool_calls": [call("i", "calc", "{\"expr\": \"1\"}")]},
                                        {"role": "tool", "tool_call_id": "i", "content": [{"type": "text", "text": "part one"},
                                                                                          {"type": "image_url", "image_url": {"url": "x"}},
                                                                                          {"type": "text", "text": "part two"}]}], [CALC], {}
    yield "consecutive_user_messages_merge", [u("first"), u("second"), u("third")], None, {"thinking": True}
    yield "system_only", [sys_("Just a system prompt.")], None, {"thinking": True}
    yield "multi_turn_tools_thinking_keeps_all_reasoning", [
        sys_("S"), u("q1"), {"role": "assistant", "content": "", "reasoning_content": "r1", "tool_calls": [call("1", "now", "{}")]},
        {"role": "tool", "tool_call_id": "1", "content": "t"}, a("answer 1", "r2"), u("q2"), a("answer 2", "r3"), u("q3")], [NOARGS], {"thinking": True}
    yield "code_and_whitespace", [u("```python\ndef f():\n\treturn 1\n```\n\n"), a("Done.\n\n", "  spaced  \n")], None, {"thinking": True}


def load_reference(path):
    spec = importlib.util.spec_from_file_location("encoding_dsv4", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_text(ref, messages, tools, opts):
    msgs = copy.deepcopy(messages)
    for m in msgs:  # the engine accepts object arguments; the reference needs the JSON text
        for c in m.get("tool_calls") or []:
            if not isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"], ensure_ascii=False)
    if tools:
        if msgs and msgs[0]["role"] == "system":
            msgs[0]["tools"] = tools
        else:
            msgs.insert(0, {"role": "system", "content": "", "tools": tools})
    mode = "thinking" if opts.get("thinking") else "chat"
    effort = opts.get("effort")
    if opts.get("variant") == "0731":
        text = ref.encode_messages(msgs, thinking_mode=mode, drop_thinking=opts.get("drop_thinking", True))
        prefix = {"low": "", "high": P_ABS, "max": P_BEYOND}[effort or "low"] if mode == "thinking" else ""
        assert text.startswith(BOS)
        return BOS + prefix + text[len(BOS):]
    return ref.encode_messages(msgs, thinking_mode=mode, drop_thinking=opts.get("drop_thinking", True),
                               reasoning_effort=effort if mode == "thinking" else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True, help="path to the official encoding_dsv4.py")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/tokenizer/data/chat_cases.jsonl"))
    args = ap.parse_args()
    ref = load_reference(args.reference)
    hf, _, _ = load_hf()
    n = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for name, messages, tools, opts in cases():
            text = reference_text(ref, messages, tools, opts)
            row = {"name": name, "messages": messages, "tools": tools, "options": opts, "text": text,
                   "ids": hf.encode(text, add_special_tokens=False).ids}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    print(f"{n} cases written to {args.out}")


if __name__ == "__main__":
    main()
