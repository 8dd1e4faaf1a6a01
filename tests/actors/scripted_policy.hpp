// tests/actors/scripted_policy.hpp: a real tokenizer and a real model directory, made so that a
// test knows what the engine will sample. The tokenizer (byte-level BPE trained on the CPU task
// suite and the prompt template) holds each scripted response as one special token; the model's
// weights (an untied Llama of one layer whose attention and MLP outputs are zero, and whose token
// embeddings are all equal) give every position the same next-token logits, chosen by the test.
// With max_new_tokens = 1 every completion is one whole scripted response, drawn with a known
// probability, and its behaviour log-prob has a closed form. No torch headers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "text/tokenizer.hpp"

namespace crucible::testing {

/// A tokenizer whose special tokens are "<|endoftext|>", "<|im_start|>", "<|im_end|>" (eos, the
/// ChatML template) and then `responses` in order (ids 3, 4, ...). The test fails if it cannot
/// be made.
std::shared_ptr<const policy::tokenizer> scripted_tokenizer(const std::vector<std::string>& responses);

/// The id of `responses[i]` in a scripted_tokenizer.
inline std::int32_t response_id(std::size_t i) { return static_cast<std::int32_t>(3 + i); }

/// Writes an HF model directory (config.json, model.safetensors, float32) of vocabulary `vocab`
/// whose next-token logits are `logits[token]` for the listed tokens and 0 for all others, at
/// every position and for every prompt. The test fails if it cannot be written.
void write_scripted_model(const std::filesystem::path& dir, std::int64_t vocab,
                          const std::map<std::int32_t, double>& logits);

/// log softmax of those logits at `token`: the behaviour log-prob (temperature 1) the engine
/// must report for it.
double scripted_log_prob(std::int64_t vocab, const std::map<std::int32_t, double>& logits, std::int32_t token);

/// A response in the three sections of the prompt template with `code` as its code block.
std::string scripted_response(const std::string& code);

} // namespace crucible::testing
