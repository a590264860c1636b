#include "server/openai_request.h"

#include <algorithm>
#include <set>

#include "server/api_error.h"

namespace dsv4::server {

namespace {

// Fields accepted by both endpoints; each endpoint adds its own.
const std::set<std::string> kCommonFields = {
    "model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "stop",
    "n", "user", "presence_penalty", "frequency_penalty", "logit_bias"};

void refuse_unknown_fields(const ordered_json& body, const std::set<std::string>& extra) {
  for (const auto& [key, value] : body.items())
    if (!kCommonFields.count(key) && !extra.count(key))
      throw ApiError(400, "Unrecognized request argument supplied: " + key, key);
}

bool has(const ordered_json& body, const char* name) { return body.contains(name) && !body[name].is_null(); }

double number(const ordered_json& body, const char* name, double lo, double hi) {
  const ordered_json& v = body[name];
  if (!v.is_number()) bad_field(name, std::string("expected a number, got ") + v.type_name());
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad_field(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

int64_t integer(const ordered_json& body, const char* name, int64_t lo, int64_t hi) {
  const ordered_json& v = body[name];
  if (!v.is_number_integer()) bad_field(name, std::string("expected an integer, got ") + v.type_name());
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) bad_field(name, "out of range");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad_field(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

bool boolean(const ordered_json& body, const char* name) {
  if (!body[name].is_boolean()) bad_field(name, std::string("expected a boolean, got ") + body[name].type_name());
  return body[name].get<bool>();
}

std::string string(const ordered_json& body, const char* name) {
  if (!body[name].is_string()) bad_field(name, std::string("expected a string, got ") + body[name].type_name());
  return body[name].get<std::string>();
}

void check_model(const ordered_json& body, const std::string& model_id) {
  if (!has(body, "model")) bad_field("model", "missing");
  const std::string model = string(body, "model");
  if (model != model_id)
    throw ApiError(404, "The model `" + model + "` does not exist; this server serves `" + model_id + "`", "model",
                   "model_not_found");
}

// The parameters dsv4 has no implementation for are accepted only at their neutral values.
void refuse_unsupported(const ordered_json& body) {
  for (const char* name : {"presence_penalty", "frequency_penalty"})
    if (has(body, name) && number(body, name, -2, 2) != 0) bad_field(name, "not supported (only 0)");
  if (has(body, "logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    bad_field("logit_bias", "not supported");
  if (has(body, "n") && integer(body, "n", 1, 128) != 1) bad_field("n", "only n = 1 is supported");
}

GenerationOptions parse_options(const ordered_json& body, int64_t max_tokens_limit) {
  GenerationOptions o;
  refuse_unsupported(body);
  if (has(body, "temperature")) o.sampling.temperature = float(number(body, "temperature", 0, 2));
  if (has(body, "top_p")) {
    o.sampling.top_p = float(number(body, "top_p", 0, 1));
    if (o.sampling.top_p <= 0) bad_field("top_p", "must be greater than 0");
  }
  if (has(body, "top_k")) o.sampling.top_k = std::max<int64_t>(0, integer(body, "top_k", -1, INT32_MAX));
  if (has(body, "min_p")) o.sampling.min_p = float(number(body, "min_p", 0, 1));
  if (has(body, "seed")) {
    o.sampling.seed = uint64_t(integer(body, "seed", INT64_MIN, INT64_MAX));
    o.seeded = true;
  }
  if (has(body, "max_tokens")) o.max_tokens = integer(body, "max_tokens", 1, max_tokens_limit);
  if (has(body, "stop")) {
    const ordered_json& stop = body["stop"];
    if (stop.is_string()) {
      o.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array() && stop.size() <= 4) {
      for (const ordered_json& s : stop) {
        if (!s.is_string()) bad_field("stop", "expected a string or an array of up to 4 strings");
        o.stop.push_back(s.get<std::string>());
      }
    } else {
      bad_field("stop", "expected a string or an array of up to 4 strings");
    }
    if (std::ranges::any_of(o.stop, [](const std::string& s) { return s.empty(); }))
      bad_field("stop", "stop strings must not be empty");
  }
  if (has(body, "stream")) o.stream = boolean(body, "stream");
  if (has(body, "stream_options")) {
    const ordered_json& so = body["stream_options"];
    if (!so.is_object()) bad_field("stream_options", "expected an object");
    if (!o.stream) bad_field("stream_options", "only allowed when stream is true");
    for (const auto& [key, value] : so.items())
      if (key != "include_usage") bad_field("stream_options." + key, "unknown option");
    if (has(so, "include_usage")) o.include_usage = boolean(so, "include_usage");
  }
  return o;
}

ToolChoice parse_tool_choice(const ordered_json& body, const ordered_json& tools) {
  ToolChoice choice;
  if (!has(body, "tool_choice")) return choice;
  const ordered_json& tc = body["tool_choice"];
  if (tc.is_string()) {
    const std::string mode = tc.get<std::string>();
    if (mode == "auto") choice.mode = ToolChoice::Mode::automatic;
    else if (mode == "none") choice.mode = ToolChoice::Mode::none;
    else if (mode == "required") choice.mode = ToolChoice::Mode::required;
    else bad_field("tool_choice", "\"" + mode + "\" is not one of auto, none, required");
  } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("function") &&
             tc["function"].is_object() && tc["function"].contains("name") && tc["function"]["name"].is_string()) {
    choice.mode = ToolChoice::Mode::named;
    choice.name = tc["function"]["name"].get<std::string>();
  } else {
    bad_field("tool_choice", "expected auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if ((choice.mode == ToolChoice::Mode::required || choice.mode == ToolChoice::Mode::named) && tools.is_null())
    bad_field("tool_choice", "requires tools");
  if (choice.mode == ToolChoice::Mode::named &&
      std::ranges::none_of(tools, [&](const ordered_json& t) { return t["function"]["name"] == choice.name; }))
    bad_field("tool_choice", "no tool named \"" + choice.name + "\" in tools");
  return choice;
}

ordered_json parse_tools(const ordered_json& body) {
  if (!has(body, "tools")) return nullptr;
  const ordered_json& tools = body["tools"];
  if (!tools.is_array()) bad_field("tools", "expected an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const ordered_json& t = tools[i];
    if (!t.is_object() || t.value("type", "") != "function")
      bad_field(where, "expected {\"type\": \"function\", \"function\": {...}}");
    if (!t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string() || t["function"]["name"].get<std::string>().empty())
      bad_field(where + ".function.name", "missing");
  }
  return tools.empty() ? ordered_json(nullptr) : tools;
}

// DeepSeek's API values onto the checkpoint's effort table (§3.7): "" means "no thinking".
std::string map_effort(const std::string& effort, tk::ChatVariant variant) {
  const bool table_0731 = variant == tk::ChatVariant::v4_0731;
  if (effort == "none") return "";
  if (effort == "minimal" || effort == "low" || effort == "medium") return table_0731 ? "low" : "high";
  if (effort == "high") return "high";
  if (effort == "xhigh" || effort == "max") return "max";
  bad_field("reasoning_effort", "\"" + effort + "\" is not one of none, minimal, low, medium, high, xhigh, max");
}

}  // namespace

ordered_json parse_body(const std::string& text) {
  ordered_json body;
  try {
    body = ordered_json::parse(text);
  } catch (const ordered_json::parse_error& e) {
    throw ApiError(400, std::string("malformed JSON body: ") + e.what());
  }
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return body;
}

ChatRequest parse_chat_request(const ordered_json& body, const std::string& model_id, tk::ChatVariant variant) {
  refuse_unknown_fields(body, {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                               "tool_choice", "parallel_tool_calls", "thinking", "reasoning_effort",
                               "response_format"});
  check_model(body, model_id);
  ChatRequest r;
  r.options = parse_options(body, INT32_MAX);
  if (has(body, "max_completion_tokens")) r.options.max_tokens = integer(body, "max_completion_tokens", 1, INT32_MAX);
  const bool logprobs = has(body, "logprobs") && boolean(body, "logprobs");
  if (has(body, "top_logprobs")) {
    if (!logprobs) bad_field("top_logprobs", "requires logprobs: true");
    r.options.top_logprobs = integer(body, "top_logprobs", 0, 20);
  } else if (logprobs) {
    r.options.top_logprobs = 0;
  }
  if (has(body, "parallel_tool_calls")) boolean(body, "parallel_tool_calls");
  if (has(body, "response_format")) {
    const ordered_json& rf = body["response_format"];
    if (!rf.is_object() || rf.value("type", "") != "text")
      bad_field("response_format", "only {\"type\": \"text\"} is supported");
  }

  if (!has(body, "messages")) bad_field("messages", "missing");
  try {
    r.messages = tk::messages_from_json(body["messages"]);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages");
  }
  if (r.messages.empty()) bad_field("messages", "must not be empty");
  for (tk::Message& m : r.messages)
    if (m.role == "developer") m.role = "system";  // OpenAI's name for it (§3.8)
  r.tools = parse_tools(body);
  r.tool_choice = parse_tool_choice(body, r.tools);

  // Thinking: explicit `thinking` wins; a reasoning_effort other than none turns it on.
  std::optional<bool> thinking;
  if (has(body, "thinking")) {
    const ordered_json& t = body["thinking"];
    const std::string type = t.is_object() && t.contains("type") && t["type"].is_string() ? t["type"].get<std::string>() : "";
    if (type != "enabled" && type != "disabled")
      bad_field("thinking", "expected {\"type\": \"enabled\"} or {\"type\": \"disabled\"}");
    thinking = type == "enabled";
  }
  std::string effort;
  if (has(body, "reasoning_effort")) {
    const std::string requested = string(body, "reasoning_effort");
    effort = map_effort(requested, variant);
    if (!thinking) thinking = requested != "none";
  }
  r.thinking = thinking.value_or(false);
  r.reasoning_effort = r.thinking ? effort : "";
  if (r.thinking && (r.tool_choice.mode == ToolChoice::Mode::required || r.tool_choice.mode == ToolChoice::Mode::named))
    bad_field("tool_choice", "required and named tool choices are not supported in thinking mode (as DeepSeek's API)");
  return r;
}

CompletionRequest parse_completion_request(const ordered_json& body, const std::string& model_id) {
  refuse_unknown_fields(body, {"prompt", "logprobs", "echo", "suffix", "best_of", "return_tokens_as_token_ids"});
  check_model(body, model_id);
  CompletionRequest r;
  r.options = parse_options(body, INT32_MAX);
  if (!has(body, "max_tokens")) r.options.max_tokens = 16;  // OpenAI's default for completions
  if (has(body, "logprobs")) r.options.top_logprobs = integer(body, "logprobs", 0, 20);
  if (has(body, "echo") && boolean(body, "echo")) bad_field("echo", "not supported");
  if (has(body, "suffix")) bad_field("suffix", "not supported");
  if (has(body, "best_of") && integer(body, "best_of", 1, 128) != 1) bad_field("best_of", "only 1 is supported");
  if (has(body, "return_tokens_as_token_ids")) r.tokens_as_ids = boolean(body, "return_tokens_as_token_ids");

  if (!has(body, "prompt")) bad_field("prompt", "missing");
  ordered_json prompt = body["prompt"];
  // A batch of one is the same as its element; larger batches are not supported.
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) prompt = prompt[0];
  if (prompt.is_string()) {
    r.prompt_text = prompt.get<std::string>();
    if (r.prompt_text->empty()) bad_field("prompt", "must not be empty");
  } else if (prompt.is_array() && !prompt.empty() && std::ranges::all_of(prompt, [](const ordered_json& v) { return v.is_number_integer(); })) {
    for (const ordered_json& v : prompt) {
      if (v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) bad_field("prompt", "token id out of range");
      r.prompt_ids.push_back(int32_t(v.get<int64_t>()));
    }
  } else {
    bad_field("prompt", "expected a string, or a non-empty array of token ids (one prompt per request)");
  }
  return r;
}

}  // namespace dsv4::server
