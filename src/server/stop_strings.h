// OpenAI `stop` strings over streamed text: text is released as soon as it cannot be the start of
// a stop string; at a match, the text before it is released and the rest is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsv4::server {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Returns the text now known to be output (nothing after a match).
  std::string feed(std::string_view text);
  // The end of the output: releases what was held back.
  std::string flush();
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

}  // namespace dsv4::server
