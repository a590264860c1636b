#!/usr/bin/env python3
"""dsv4 serve end to end, driven by the official `openai` client (issue 5's acceptance tests).

    server_test.py path/to/dsv4 path/to/tiny-chat-model [TestClass ...]

Starts servers on free ports with the demo chat model (the real V4 vocabulary and tokenizer,
random weights: replies are noise but structurally valid) and checks chat and completions,
streaming and not, logprobs, stop, max_tokens, seeds, prefix-cache usage, OpenAI errors as the
client's exception types, the body size limit, cancellation on disconnect, a DSML tool-call round
trip (forced through the hidden test-only --test-force-output flag), greedy equality with
`dsv4 generate`, and a clean SIGTERM.
"""
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import openai

DSV4, MODEL = sys.argv[1], sys.argv[2]
MODEL_ID = os.path.basename(MODEL.rstrip("/"))
API_KEY = "test-key"


class Server:
    """A `dsv4 serve` child process on a free port."""

    def __init__(self, *extra):
        self.proc = subprocess.Popen([DSV4, "serve", "--model", MODEL, "--port", "0", "--api-key", API_KEY, *extra],
                                     stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("dsv4 serve exited: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return r.status, r.read().decode()

    def post_raw(self, path, body: bytes, key=API_KEY):
        req = urllib.request.Request(self.base + path, data=body, method="POST",
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def metric(self, name):
        _, text = self.get("/metrics")
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(m.group(1))

    def wait_for_idle(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.metric("dsv4_running_sequences") == 0 and self.metric("dsv4_queued_requests") == 0:
                return True
            time.sleep(0.1)
        return False

    def stop(self):
        """SIGTERM; the exit code must be 0 (under the sanitizers, also: no error, no leak)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, f"dsv4 serve exited {self.proc.returncode}:\n{err[-4000:]}"


def chat(server, **kw):
    args = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8)
    args.update(kw)
    return server.client.chat.completions.create(**args)


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max-seqs", "4", "--ctx", "512", "--max-body-mb", "1")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_models_health_metrics(self):
        models = self.server.client.models.list()
        self.assertEqual([m.id for m in models.data], [MODEL_ID])
        self.assertEqual(self.server.get("/health")[0], 200)
        _, text = self.server.get("/metrics")
        for name in ("dsv4_requests_total", "dsv4_time_to_first_token_seconds_bucket", "dsv4_sequence_state_bytes",
                     "dsv4_queued_requests", "dsv4_generation_tokens_total"):
            self.assertIn(name, text)

    def test_chat_non_streaming_with_logprobs(self):
        r = chat(self.server, logprobs=True, top_logprobs=3, temperature=0)
        choice = r.choices[0]
        self.assertEqual(choice.message.role, "assistant")
        self.assertIsInstance(choice.message.content, str)
        self.assertEqual(choice.finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 8)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 8)
        self.assertEqual(len(choice.logprobs.content), 8)
        for entry in choice.logprobs.content:
            self.assertLessEqual(entry.logprob, 0)
            self.assertEqual(len(entry.top_logprobs), 3)
            # greedy: the chosen token is the most likely one
            self.assertAlmostEqual(entry.logprob, entry.top_logprobs[0].logprob, places=5)
        self.assertEqual("".join(e.token for e in choice.logprobs.content), choice.message.content)

    def test_streaming_matches_non_streaming(self):
        whole = chat(self.server, temperature=0.8, seed=7, max_tokens=10, logprobs=True)
        stream = chat(self.server, temperature=0.8, seed=7, max_tokens=10, stream=True, logprobs=True,
                      stream_options={"include_usage": True})
        text, logprobs, finish, usage = "", [], None, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                if c.logprobs and c.logprobs.content:
                    logprobs += [e.logprob for e in c.logprobs.content]
                finish = c.finish_reason or finish
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(logprobs, [e.logprob for e in whole.choices[0].logprobs.content])
        self.assertEqual(finish, "length")
        self.assertEqual(usage.completion_tokens, 10)

    def test_seed_determinism(self):
        a = chat(self.server, temperature=1.0, seed=123, max_tokens=12).choices[0].message.content
        b = chat(self.server, temperature=1.0, seed=123, max_tokens=12).choices[0].message.content
        c = chat(self.server, temperature=1.0, seed=124, max_tokens=12).choices[0].message.content
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)

    def test_stop_string(self):
        full = chat(self.server, temperature=0, max_tokens=12).choices[0].message.content
        cut = len(full) // 2
        stop = full[cut:cut + 2]
        r = chat(self.server, temperature=0, max_tokens=12, stop=[stop])
        self.assertEqual(r.choices[0].message.content, full[:full.find(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_repeated_prompt_reports_cached_tokens(self):
        messages = [{"role": "system", "content": "You are a careful assistant. " * 20},
                    {"role": "user", "content": "Count the words of this sentence, please."}]
        first = chat(self.server, messages=messages, max_tokens=2, temperature=0)
        second = chat(self.server, messages=messages, max_tokens=2, temperature=0)
        self.assertEqual(first.choices[0].message.content, second.choices[0].message.content)
        self.assertEqual(second.usage.prompt_tokens_details.cached_tokens, second.usage.prompt_tokens - 1)
        # The next turn (without thinking) extends the previous prompt and answer: resumed too.
        follow = messages + [{"role": "assistant", "content": first.choices[0].message.content},
                             {"role": "user", "content": "And again?"}]
        third = chat(self.server, messages=follow, max_tokens=2, temperature=0)
        self.assertGreaterEqual(third.usage.prompt_tokens_details.cached_tokens, second.usage.prompt_tokens)

    def test_completions_text_and_stream(self):
        r = self.server.client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=5,
                                                  temperature=0, logprobs=2)
        self.assertEqual(r.usage.completion_tokens, 5)
        self.assertEqual(len(r.choices[0].logprobs.tokens), 5)
        streamed = "".join(c.choices[0].text for c in self.server.client.completions.create(
            model=MODEL_ID, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True) if c.choices)
        self.assertEqual(streamed, r.choices[0].text)

    def test_errors_are_openai_exceptions(self):
        bad_key = openai.OpenAI(base_url=self.server.base + "/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad_key.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}])
        with self.assertRaises(openai.NotFoundError) as e:
            chat(self.server, model="no-such-model")
        self.assertEqual(e.exception.code, "model_not_found")
        with self.assertRaises(openai.BadRequestError) as e:
            chat(self.server, temperature=5)
        self.assertEqual(e.exception.param, "temperature")
        with self.assertRaises(openai.BadRequestError) as e:
            chat(self.server, extra_body={"top_k": "many"})
        self.assertIn("top_k", e.exception.message)
        with self.assertRaises(openai.BadRequestError) as e:
            chat(self.server, extra_body={"frobnicate": 1})
        self.assertIn("frobnicate", e.exception.message)
        with self.assertRaises(openai.BadRequestError):
            chat(self.server, messages=[{"role": "wizard", "content": "x"}])
        with self.assertRaises(openai.BadRequestError):
            chat(self.server, n=2)
        with self.assertRaises(openai.BadRequestError) as e:  # --ctx 512
            chat(self.server, messages=[{"role": "user", "content": "word " * 600}])
        self.assertEqual(e.exception.code, "context_length_exceeded")
        with self.assertRaises(openai.BadRequestError):  # DeepSeek's API refuses this too
            chat(self.server, tools=[WEATHER_TOOL], tool_choice="required", extra_body={"thinking": {"type": "enabled"}})
        with self.assertRaises(openai.APIStatusError) as e:  # --max-body-mb 1
            chat(self.server, messages=[{"role": "user", "content": "x" * (2 << 20)}])
        self.assertEqual(e.exception.status_code, 413)
        with self.assertRaises(openai.BadRequestError):
            self.server.client.completions.create(model=MODEL_ID, prompt=[1, 2, 10**7], max_tokens=1)

    def test_malformed_json_gets_an_error_body(self):
        for body in (b"{not json", b"[1, 2]", b'{"model": 5, "messages": []}'):
            status, reply = self.server.post_raw("/v1/chat/completions", body)
            self.assertEqual(status, 400, body)
            self.assertEqual(set(reply["error"]), {"message", "type", "param", "code"})
        status, reply = self.server.post_raw("/v1/chat/completions", b"{}", key="wrong")
        self.assertEqual(status, 401)
        self.assertEqual(reply["error"]["code"], "invalid_api_key")

    def test_disconnect_mid_stream_frees_the_sequence(self):
        self.assertTrue(self.server.wait_for_idle())
        # 500 tokens each would take far longer than the wait below: only cancellation frees them.
        streams = [chat(self.server, max_tokens=500, stream=True) for _ in range(3)]
        for s in streams:
            for i, _ in enumerate(s):
                if i == 2:
                    break
            s.close()
        self.assertTrue(self.server.wait_for_idle(timeout=5), "sequences still running after the clients left")
        self.assertEqual(self.server.metric("dsv4_sequence_state_bytes"), 0)

    def test_concurrent_greedy_requests_match_sequential(self):
        prompts = [[0, 100 + i, 2000 + 7 * i, 30 + i] for i in range(4)]

        def ids(prompt):
            r = self.server.client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0,
                                                      logprobs=0, extra_body={"return_tokens_as_token_ids": True})
            return [int(t.split(":")[1]) for t in r.choices[0].logprobs.tokens]

        sequential = [ids(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            self.assertEqual(list(pool.map(ids, prompts)), sequential)

    def test_greedy_output_equals_dsv4_generate(self):
        prompt = [0, 17, 42, 1000, 5000, 77]
        r = self.server.client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=8, temperature=0,
                                                  logprobs=0, extra_body={"return_tokens_as_token_ids": True})
        served = [int(t.split(":")[1]) for t in r.choices[0].logprobs.tokens]
        out = subprocess.run([DSV4, "generate", "--model", MODEL, "--prompt-ids", ",".join(map(str, prompt)),
                              "--max-tokens", "8"], capture_output=True, text=True, check=True)
        self.assertEqual(served, [int(t) for t in out.stdout.split()])


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

FORCED_OUTPUT = ("The user wants the weather.</think>Let me look that up."
                 "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                 "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                 "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")


class ToolCallTest(unittest.TestCase):
    """The engine is forced to emit DSML; the client must see tool_calls and clean content."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
        cls.tmp.write(FORCED_OUTPUT)
        cls.tmp.close()
        cls.server = Server("--test-force-output", cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        os.unlink(cls.tmp.name)

    def request(self, **kw):
        return chat(self.server, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL],
                    max_tokens=200, reasoning_effort="high", **kw)

    def test_streamed_tool_call(self):
        reasoning, content, calls, finish = "", "", {}, None
        for chunk in self.request(stream=True):
            for c in chunk.choices:
                reasoning += getattr(c.delta, "reasoning_content", None) or ""
                content += c.delta.content or ""
                for tc in c.delta.tool_calls or []:
                    call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = tc.id or call["id"]
                    call["name"] += (tc.function.name or "") if tc.function else ""
                    call["arguments"] += (tc.function.arguments or "") if tc.function else ""
                finish = c.finish_reason or finish
        self.assertEqual(reasoning, "The user wants the weather.")
        self.assertEqual(content, "Let me look that up.")
        self.assertNotIn("DSML", content + reasoning)
        self.assertEqual(list(calls), [0])
        self.assertTrue(calls[0]["id"].startswith("call_"))
        self.assertEqual(calls[0]["name"], "get_weather")
        self.assertEqual(json.loads(calls[0]["arguments"]), {"city": "Paris"})
        self.assertEqual(finish, "tool_calls")

    def test_round_trip(self):
        r = self.request()
        message = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertEqual(message.content, "Let me look that up.")
        self.assertEqual(message.reasoning_content, "The user wants the weather.")
        self.assertGreater(r.usage.completion_tokens_details.reasoning_tokens, 0)
        call = message.tool_calls[0]
        self.assertEqual((call.function.name, json.loads(call.function.arguments)), ("get_weather", {"city": "Paris"}))
        # The client runs the tool and sends the result back, reasoning included (tools keep it).
        follow = [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": message.content, "reasoning_content": message.reasoning_content,
                   "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]
        r2 = chat(self.server, messages=follow, tools=[WEATHER_TOOL], max_tokens=200, reasoning_effort="high")
        self.assertEqual(r2.choices[0].message.tool_calls[0].function.name, "get_weather")
        self.assertGreater(r2.usage.prompt_tokens_details.cached_tokens, 0)

    def test_named_tool_choice_opens_the_call(self):
        # The prompt already opens the invoke, so the forced text's own block comes after it: the
        # parser sees a complete call to get_weather first.
        r = chat(self.server, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL],
                 tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=200)
        self.assertEqual(r.choices[0].message.tool_calls[0].function.name, "get_weather")
        self.assertNotIn("DSML", r.choices[0].message.content or "")


class SpeculativeTest(unittest.TestCase):
    """serve --speculative answers exactly what the plain server does (greedy, seeded, streamed), and
    /metrics counts the drafts."""

    @classmethod
    def setUpClass(cls):
        cls.plain = Server("--max-seqs", "2", "--ctx", "512")
        cls.spec = Server("--max-seqs", "2", "--ctx", "512", "--speculative")

    @classmethod
    def tearDownClass(cls):
        cls.plain.stop()
        cls.spec.stop()

    def test_same_answers(self):
        for kw in (dict(temperature=0, max_tokens=24), dict(temperature=0.9, seed=5, max_tokens=24)):
            want = chat(self.plain, **kw).choices[0].message.content
            self.assertEqual(chat(self.spec, **kw).choices[0].message.content, want)
            streamed = "".join(c.choices[0].delta.content or "" for c in chat(self.spec, stream=True, **kw) if c.choices)
            self.assertEqual(streamed, want)
        metrics = self.spec.get("/metrics")[1]
        drafted = re.search(r"^dsv4_draft_tokens_total (\d+)", metrics, re.M)
        self.assertIsNotNone(drafted, metrics)
        self.assertGreater(int(drafted.group(1)), 0)


class ShutdownTest(unittest.TestCase):
    def test_sigterm_finishes_in_flight_requests_and_exits_0(self):
        server = Server()
        stream = chat(server, max_tokens=30, stream=True)
        first = next(iter(stream))
        server.proc.send_signal(signal.SIGTERM)
        finish = None
        for chunk in stream:
            for c in chunk.choices:
                finish = c.finish_reason or finish
        self.assertEqual(finish, "length")
        self.assertIsNotNone(first)
        server.stop()  # asserts exit code 0


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)  # further arguments pick test classes
