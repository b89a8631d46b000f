#include "runtime/kernels/transformer_checks.h"

#include <string>

namespace ampdist::kernels::checks {

void require_on(const char* op, const char* what, const Tensor& t, Device device) {
  if (t.device() != device)
    throw Error(std::string(op) + ": " + what + " is on " + device_name(t.device()) + ", the other tensors on " +
                device_name(device));
}

void require_shape(const char* op, const char* what, const Tensor& t, const Shape& want, Device device) {
  require_on(op, what, t, device);
  if (t.shape() != want)
    throw Error(std::string(op) + ": " + what + " is " + shape_str(t.shape()) + ", expected " + shape_str(want));
}

void require_fp32(const char* op, const char* what, const Tensor& t) {
  if (t.dtype() != DType::kFloat32)
    throw Error(std::string(op) + ": " + what + " must be fp32, got " + dtype_name(t.dtype()));
}

void embedding_forward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out, Device device) {
  const char* op = "embedding_forward";
  require_on(op, "wte", wte, device);
  require_on(op, "wpe", wpe, device);
  require_fp32(op, "wte", wte);
  require_fp32(op, "wpe", wpe);
  if (wte.ndim() != 2 || wpe.ndim() != 2 || wte.dim(1) != wpe.dim(1))
    throw Error(std::string(op) + ": wte " + shape_str(wte.shape()) + " and wpe " + shape_str(wpe.shape()) +
                " must be [V, C] and [T_max, C]");
  const int64_t n = static_cast<int64_t>(tokens.size()), c = wte.dim(1), v = wte.dim(0);
  if (seq_len <= 0 || seq_len > wpe.dim(0) || n % seq_len != 0)
    throw Error(std::string(op) + ": " + std::to_string(n) + " tokens are not windows of " +
                std::to_string(seq_len) + " <= " + std::to_string(wpe.dim(0)) + " positions");
  require_shape(op, "out", out, {n, c}, device);
  require_fp32(op, "out", out);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t tok = tokens[static_cast<size_t>(r)];
    if (tok < 0 || tok >= v)
      throw Error(std::string(op) + ": token " + std::to_string(tok) + " at position " + std::to_string(r) +
                      " is outside the vocabulary [0, " + std::to_string(v) + ")",
                  ErrorKind::kBadInput);
  }
}

void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe, Device device) {
  const char* op = "embedding_backward";
  require_on(op, "dwte", dwte, device);
  require_on(op, "dwpe", dwpe, device);
  require_fp32(op, "dwte", dwte);
  require_fp32(op, "dwpe", dwpe);
  const int64_t n = static_cast<int64_t>(tokens.size()), c = dwte.dim(1), v = dwte.dim(0);
  require_shape(op, "dout", dout, {n, c}, device);
  if (dwpe.dim(1) != c || seq_len <= 0 || seq_len > dwpe.dim(0))
    throw Error(std::string(op) + ": dwpe " + shape_str(dwpe.shape()) + " does not match " + std::to_string(c) +
                " channels and " + std::to_string(seq_len) + " positions");
  for (int32_t tok : tokens)
    if (tok < 0 || tok >= v)
      throw Error(std::string(op) + ": token " + std::to_string(tok) + " outside the vocabulary (the forward checks it)");
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y, const Tensor& mean,
                       const Tensor& rstd, Device device) {
  const char* op = "layernorm_forward";
  require_on(op, "x", x, device);
  if (x.ndim() != 2) throw Error(std::string(op) + ": x is " + shape_str(x.shape()) + ", expected [N, C]");
  const int64_t n = x.dim(0), c = x.dim(1);
  require_shape(op, "gamma", gamma, {c}, device);
  require_shape(op, "beta", beta, {c}, device);
  require_fp32(op, "gamma", gamma);
  require_fp32(op, "beta", beta);
  require_shape(op, "y", y, {n, c}, device);
  require_shape(op, "mean", mean, {n}, device);
  require_shape(op, "rstd", rstd, {n}, device);
  require_fp32(op, "mean", mean);
  require_fp32(op, "rstd", rstd);
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, Device device) {
  const char* op = "layernorm_backward";
  require_on(op, "x", x, device);
  if (x.ndim() != 2) throw Error(std::string(op) + ": x is " + shape_str(x.shape()) + ", expected [N, C]");
  const int64_t n = x.dim(0), c = x.dim(1);
  require_shape(op, "gamma", gamma, {c}, device);
  require_shape(op, "mean", mean, {n}, device);
  require_shape(op, "rstd", rstd, {n}, device);
  require_shape(op, "dy", dy, {n, c}, device);
  require_shape(op, "dx", dx, {n, c}, device);
  require_fp32(op, "dx", dx);
  require_shape(op, "dgamma", dgamma, {c}, device);
  require_shape(op, "dbeta", dbeta, {c}, device);
  require_fp32(op, "dgamma", dgamma);
  require_fp32(op, "dbeta", dbeta);
}

namespace {
void check_attention_shape(const char* op, const Tensor& qkv, const AttentionShape& s, Device device) {
  if (s.batch < 0 || s.seq_len <= 0 || s.n_head <= 0 || s.head_dim <= 0)
    throw Error(std::string(op) + ": bad shape B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq_len) +
                " H=" + std::to_string(s.n_head) + " hs=" + std::to_string(s.head_dim));
  require_shape(op, "qkv", qkv, {s.batch * s.seq_len, 3 * s.channels()}, device);
}
void check_key_mask(const char* op, std::span<const uint8_t> key_mask, const AttentionShape& s) {
  if (!key_mask.empty() && static_cast<int64_t>(key_mask.size()) != s.batch * s.seq_len)
    throw Error(std::string(op) + ": key_mask has " + std::to_string(key_mask.size()) + " entries, expected " +
                std::to_string(s.batch * s.seq_len));
}
}  // namespace

void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       const Tensor& probs, const Tensor& out, Device device) {
  const char* op = "attention_forward";
  check_attention_shape(op, qkv, s, device);
  require_shape(op, "probs", probs, {s.batch, s.n_head, s.seq_len, s.seq_len}, device);
  require_fp32(op, "probs", probs);
  require_shape(op, "out", out, {s.batch * s.seq_len, s.channels()}, device);
  check_key_mask(op, key_mask, s);
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, const Tensor& dout,
                        const Tensor& dqkv, Device device) {
  const char* op = "attention_backward";
  check_attention_shape(op, qkv, s, device);
  require_shape(op, "probs", probs, {s.batch, s.n_head, s.seq_len, s.seq_len}, device);
  require_fp32(op, "probs", probs);
  require_shape(op, "dout", dout, {s.batch * s.seq_len, s.channels()}, device);
  require_shape(op, "dqkv", dqkv, {s.batch * s.seq_len, 3 * s.channels()}, device);
}

void flash_attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                             const Tensor& stats, const Tensor& out, Device device) {
  const char* op = "flash_attention_forward";
  check_attention_shape(op, qkv, s, device);
  require_shape(op, "stats", stats, {s.batch, s.n_head, s.seq_len, 2}, device);
  require_fp32(op, "stats", stats);
  require_shape(op, "out", out, {s.batch * s.seq_len, s.channels()}, device);
  check_key_mask(op, key_mask, s);
}

void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& stats, const AttentionShape& s,
                              std::span<const uint8_t> key_mask, const Tensor& dout, const Tensor& dqkv,
                              Device device) {
  const char* op = "flash_attention_backward";
  check_attention_shape(op, qkv, s, device);
  require_shape(op, "out", out, {s.batch * s.seq_len, s.channels()}, device);
  require_shape(op, "stats", stats, {s.batch, s.n_head, s.seq_len, 2}, device);
  require_fp32(op, "stats", stats);
  require_shape(op, "dout", dout, {s.batch * s.seq_len, s.channels()}, device);
  require_shape(op, "dqkv", dqkv, {s.batch * s.seq_len, 3 * s.channels()}, device);
  check_key_mask(op, key_mask, s);
}

bool dropout(const Tensor& x, float p, std::span<const uint32_t> sample_ids, int64_t seq_len, Device device) {
  const char* op = "dropout_inplace";
  require_on(op, "x", x, device);
  if (!(p >= 0.0f && p < 1.0f)) throw Error(std::string(op) + ": p must be in [0, 1), got " + std::to_string(p));
  if (p == 0.0f) return false;
  if (x.ndim() != 2 || seq_len <= 0 || x.dim(0) != static_cast<int64_t>(sample_ids.size()) * seq_len)
    throw Error(std::string(op) + ": x " + shape_str(x.shape()) + " is not " + std::to_string(sample_ids.size()) +
                " windows of " + std::to_string(seq_len) + " rows");
  return true;
}

void add_inplace(const Tensor& x, const Tensor& y, Device device) {
  const char* op = "add_inplace";
  require_on(op, "x", x, device);
  require_on(op, "y", y, device);
  require_fp32(op, "x", x);
  if (x.numel() != y.numel())
    throw Error(std::string(op) + ": element counts differ: " + shape_str(x.shape()) + " vs " + shape_str(y.shape()));
}

}  // namespace ampdist::kernels::checks
