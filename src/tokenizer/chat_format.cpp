// Rendering of the V4 prompt (tokenizer-and-chat.md §3.2–3.8), following the order of the
// reference encoder: attach tools → merge tool messages into user turns → sort tool results by
// call order → drop earlier reasoning → render each message and the transition after it.
#include "tokenizer/chat_format.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/python_json.h"
#include "tokenizer/utf8.h"

namespace dsv4::tokenizer {

namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

constexpr std::string_view kEffortAbsoluteMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";
constexpr std::string_view kEffortBeyondMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively decompose the problem into its most fundamental components, trace every causal "
    "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles "
    "and are certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

// The tools block (§3.3) around the schema lines.
constexpr std::string_view kToolsHead =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

const char* const kTasks[][2] = {{"action", "<｜action｜>"}, {"query", "<｜query｜>"},
                                 {"authority", "<｜authority｜>"}, {"domain", "<｜domain｜>"},
                                 {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};

std::string_view task_token(const std::string& task) {
  for (auto& [name, token] : kTasks)
    if (task == name) return token;
  fail(ErrorCode::invalid_input, "task \"{}\" is not one of action, query, authority, domain, title, read_url",
       task);
}

// A user turn after tool messages are merged (reference: content_blocks).
struct Block {
  bool is_tool_result = false;
  std::string text;         // text block, or the tool result's rendered content
  std::string tool_use_id;
};

// A message after pre-processing.
struct Turn {
  std::string role;
  std::string text;  // content as text (system, developer, latest_reminder, assistant, user w/o blocks)
  std::vector<Block> blocks;
  bool has_blocks = false;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  ordered_json tools, response_format;
  std::optional<std::string> task;
  bool wo_eos = false;
};

// Text parts of an OpenAI content value, joined with `separator`; other parts per `other`.
std::string content_text(const ordered_json& content, std::string_view separator, bool mark_unsupported,
                         const std::string& where) {
  if (content.is_null()) return {};
  if (content.is_string()) return to_valid_utf8(content.get_ref<const std::string&>());
  if (!content.is_array()) return python_json_dumps(content);
  std::string out;
  bool first = true;
  for (const auto& part : content) {
    std::string piece;
    std::string type = part.is_object() ? part.value("type", "") : "";
    if (part.is_string()) {
      piece = part.get<std::string>();
    } else if (type == "text") {
      piece = part.value("text", "");
    } else if (mark_unsupported) {
      piece = "[Unsupported " + (type.empty() ? std::string("None") : type) + "]";
    } else {
      fail(ErrorCode::unsupported, "{}: content part of type \"{}\": only text is supported", where, type);
    }
    if (!first) out += separator;
    out += to_valid_utf8(piece);
    first = false;
  }
  return out;
}

// merge_tool_messages (§3.2 step 1): tool messages become tool_result blocks of a user turn;
// a user message right after them (without a task) joins that same turn.
std::vector<Turn> merge_tool_messages(const std::vector<Message>& messages) {
  std::vector<Turn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    auto last_is_open_user = [&] { return !turns.empty() && turns.back().role == "user" && turns.back().has_blocks; };
    if (m.role == "tool") {
      Block b{true, content_text(m.content, "\n\n", true, where), m.tool_call_id};
      if (last_is_open_user()) {
        turns.back().blocks.push_back(std::move(b));
      } else {
        Turn t;
        t.role = "user";
        t.blocks.push_back(std::move(b));
        t.has_blocks = true;
        turns.push_back(std::move(t));
      }
      continue;
    }
    Turn t;
    t.role = m.role;
    if (m.role == "user") {
      Block b{false, content_text(m.content, "", false, where), {}};
      if (last_is_open_user() && !turns.back().task) {
        turns.back().blocks.push_back(std::move(b));
        continue;
      }
      t.text = b.text;
      t.blocks.push_back(std::move(b));
      t.has_blocks = true;
    } else {
      t.text = content_text(m.content, "", false, where);
    }
    t.reasoning = to_valid_utf8(m.reasoning_content);
    t.tool_calls = m.tool_calls;
    t.tools = m.tools;
    t.response_format = m.response_format;
    t.task = m.task;
    t.wo_eos = m.wo_eos;
    turns.push_back(std::move(t));
  }
  return turns;
}

// sort_tool_results_by_call_order (§3.2 step 2): tool_result blocks of a user turn follow the
// call order of the latest assistant tool calls; unknown ids sort as 0; text blocks stay put.
void sort_tool_results(std::vector<Turn>& turns) {
  std::vector<std::string> order;
  for (Turn& t : turns) {
    if (t.role == "assistant" && !t.tool_calls.empty()) {
      order.clear();
      for (const ToolCall& c : t.tool_calls) order.push_back(c.id);
    } else if (t.role == "user" && t.has_blocks) {
      std::vector<Block> results;
      for (const Block& b : t.blocks)
        if (b.is_tool_result) results.push_back(b);
      bool any_id = std::any_of(order.begin(), order.end(), [](auto& id) { return !id.empty(); });
      if (results.size() < 2 || !any_id) continue;
      auto rank = [&](const Block& b) {  // the last call with that id wins, as in a Python dict
        size_t r = 0;
        for (size_t k = 0; k < order.size(); ++k)
          if (!order[k].empty() && order[k] == b.tool_use_id) r = k;
        return r;
      };
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : t.blocks)
        if (b.is_tool_result) b = results[next++];
    }
  }
}

int last_user_index(const std::vector<Turn>& turns) {
  for (int i = int(turns.size()) - 1; i >= 0; --i)
    if (turns[i].role == "user" || turns[i].role == "developer") return i;
  return -1;
}

// _drop_thinking_messages (§3.2 step 3): before the last user turn, assistant turns lose their
// reasoning and developer turns (and unknown roles) are dropped.
std::vector<Turn> drop_thinking(std::vector<Turn> turns) {
  int last_user = last_user_index(turns);
  std::vector<Turn> kept;
  for (int i = 0; i < int(turns.size()); ++i) {
    Turn& t = turns[i];
    bool keep_role = t.role == "user" || t.role == "system" || t.role == "tool" || t.role == "latest_reminder";
    if (keep_role || i >= last_user) {
      kept.push_back(std::move(t));
    } else if (t.role == "assistant") {
      t.reasoning.clear();
      kept.push_back(std::move(t));
    }
  }
  return kept;
}

// Appends to the prompt, remembering which bytes are the renderer's own (may hold control tokens).
class PromptWriter {
 public:
  void markup(std::string_view s) {
    if (s.empty()) return;
    size_t begin = prompt_.text.size();
    prompt_.text += s;
    auto& ranges = prompt_.control_ranges;
    if (!ranges.empty() && ranges.back().end == begin)
      ranges.back().end = prompt_.text.size();
    else
      ranges.push_back({begin, prompt_.text.size()});
  }
  void text(std::string_view s) { prompt_.text += s; }
  RenderedPrompt take() { return std::move(prompt_); }

 private:
  RenderedPrompt prompt_;
};

void write_tools(PromptWriter& w, const ordered_json& tools, const std::string& where) {
  w.markup(kToolsHead);
  bool first = true;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& tool = tools[i];
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object())
      fail(ErrorCode::invalid_input, "{}.tools[{}]: expected {{\"type\": \"function\", \"function\": {{...}}}}",
           where, i);
    if (!first) w.markup("\n");
    w.text(python_json_dumps(tool["function"]));
    first = false;
  }
  w.markup(kToolsTail);
}

void write_system_extras(PromptWriter& w, const Turn& t, const std::string& where) {
  if (!t.tools.is_null() && !t.tools.empty()) {
    w.markup("\n\n");
    write_tools(w, t.tools, where);
  }
  if (!t.response_format.is_null() && !(t.response_format.is_object() && t.response_format.empty())) {
    w.markup("\n\n");
    w.markup(kResponseFormatHead);
    w.text(python_json_dumps(t.response_format));
  }
}

// The parameters of one call (§3.4): a JSON object whose keys are written in order; a string
// that is not JSON becomes a single "arguments" string parameter, as in the reference.
void write_arguments(PromptWriter& w, const ToolCall& call, const std::string& where) {
  ordered_json args = call.arguments;
  if (args.is_string()) {
    const std::string& raw = args.get_ref<const std::string&>();
    ordered_json parsed = ordered_json::parse(raw, nullptr, false);
    args = parsed.is_discarded() ? ordered_json{{"arguments", raw}} : parsed;
  }
  if (args.is_null()) args = ordered_json::object();
  if (!args.is_object())
    fail(ErrorCode::invalid_input, "{}.function.arguments: got {}, expected a JSON object (§3.4)", where,
         std::string(args.type_name()));
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) w.markup("\n");
    first = false;
    w.markup("<｜DSML｜parameter name=\"");
    w.text(to_valid_utf8(key));
    bool is_string = value.is_string();
    w.markup(is_string ? "\" string=\"true\">" : "\" string=\"false\">");
    w.text(is_string ? to_valid_utf8(value.get_ref<const std::string&>()) : python_json_dumps(value));
    w.markup("</｜DSML｜parameter>");
  }
}

void write_tool_calls(PromptWriter& w, const std::vector<ToolCall>& calls, const std::string& where) {
  w.markup("\n\n<｜DSML｜tool_calls>\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) w.markup("\n");
    w.markup("<｜DSML｜invoke name=\"");
    w.text(to_valid_utf8(calls[i].name));
    w.markup("\">\n");
    write_arguments(w, calls[i], where + ".tool_calls[" + std::to_string(i) + "]");
    w.markup("\n</｜DSML｜invoke>");
  }
  w.markup("\n</｜DSML｜tool_calls>");
}

std::string_view effort_prefix(const ChatOptions& o) {
  const std::string& e = o.reasoning_effort;
  if (o.variant == ChatVariant::v4_preview) {
    if (e.empty() || e == "high") return {};
    if (e == "max") return kEffortAbsoluteMax;
    fail(ErrorCode::invalid_input, "reasoning effort \"{}\": the preview checkpoint accepts high or max (§3.7)", e);
  }
  if (e.empty() || e == "low") return {};
  if (e == "high") return kEffortAbsoluteMax;
  if (e == "max") return kEffortBeyondMax;
  fail(ErrorCode::invalid_input, "reasoning effort \"{}\": the 0731 checkpoint accepts low, high or max (§3.7)", e);
}

struct RenderContext {
  const std::vector<Turn>& turns;
  const ChatOptions& options;
  bool drop_thinking;  // effective: off whenever a message carries tools
  int last_user;
};

void render_turn(PromptWriter& w, const RenderContext& c, int index) {
  const Turn& t = c.turns[index];
  std::string where = "message " + std::to_string(index) + " (" + t.role + ")";
  bool thinking = c.options.thinking;
  if (index == 0 && thinking) w.markup(effort_prefix(c.options));

  if (t.role == "system") {
    w.text(t.text);
    write_system_extras(w, t, where);
  } else if (t.role == "developer") {
    w.markup(kUser);
    w.text(t.text);
    write_system_extras(w, t, where);
  } else if (t.role == "user") {
    w.markup(kUser);
    for (size_t b = 0; b < t.blocks.size(); ++b) {
      if (b) w.markup("\n\n");
      if (t.blocks[b].is_tool_result) w.markup("<tool_result>");
      w.text(t.blocks[b].text);
      if (t.blocks[b].is_tool_result) w.markup("</tool_result>");
    }
    if (!t.has_blocks) w.text(t.text);
  } else if (t.role == "latest_reminder") {
    w.markup(kLatestReminder);
    w.text(t.text);
  } else if (t.role == "assistant") {
    bool prev_has_task = index > 0 && c.turns[index - 1].task.has_value();
    if (thinking && !prev_has_task && (!c.drop_thinking || index > c.last_user)) {
      w.text(t.reasoning);
      w.markup(kThinkEnd);
    }
    w.text(t.text);
    if (!t.tool_calls.empty()) write_tool_calls(w, t.tool_calls, where);
    if (!t.wo_eos) w.markup(kEos);
  } else {
    fail(ErrorCode::invalid_input, "{}: unknown role \"{}\"", where, t.role);
  }

  // Transition: only before an assistant/latest_reminder turn or after the last message.
  bool has_next = index + 1 < int(c.turns.size());
  if (has_next && c.turns[index + 1].role != "assistant" && c.turns[index + 1].role != "latest_reminder") return;
  if (t.task) {
    std::string_view token = task_token(*t.task);
    if (*t.task != "action") {
      w.markup(token);
    } else {
      w.markup(kAssistant);
      w.markup(thinking ? kThinkStart : kThinkEnd);
      w.markup(token);
    }
  } else if (t.role == "user" || t.role == "developer") {
    w.markup(kAssistant);
    bool open_thinking = thinking && (!c.drop_thinking || index >= c.last_user);
    w.markup(open_thinking ? kThinkStart : kThinkEnd);
  }
}

}  // namespace

RenderedPrompt render_prompt(std::vector<Message> messages, const ordered_json& tools, const ChatOptions& options) {
  if (!tools.is_null() && !tools.empty()) {
    if (!tools.is_array()) fail(ErrorCode::invalid_input, "tools: expected an array");
    if (!messages.empty() && messages[0].role == "system" && (messages[0].tools.is_null() || messages[0].tools.empty())) {
      messages[0].tools = tools;
    } else {
      Message system;
      system.role = "system";
      system.tools = tools;
      messages.insert(messages.begin(), std::move(system));
    }
  }
  std::vector<Turn> turns = merge_tool_messages(messages);
  sort_tool_results(turns);
  bool any_tools = std::any_of(turns.begin(), turns.end(), [](const Turn& t) { return !t.tools.is_null() && !t.tools.empty(); });
  bool drop = options.drop_thinking && !any_tools;
  if (options.thinking && drop) turns = drop_thinking(std::move(turns));

  PromptWriter w;
  if (options.add_bos) w.markup(kBos);
  RenderContext context{turns, options, drop, last_user_index(turns)};
  for (int i = 0; i < int(turns.size()); ++i) render_turn(w, context, i);
  RenderedPrompt prompt = w.take();
  prompt.control_tokens_in_text = options.control_tokens_in_text;
  return prompt;
}

std::vector<int32_t> RenderedPrompt::encode(const Tokenizer& tokenizer) const {
  if (control_tokens_in_text) return tokenizer.encode(text, /*parse_special=*/true);
  return tokenizer.encode_with_control_ranges(text, control_ranges);
}

}  // namespace dsv4::tokenizer
