#include "nn/accounting.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace tapelm {

namespace {
int64_t saturate(double v) { return static_cast<int64_t>(std::min(v, 9.0e18)); }
}  // namespace

ModelCost model_cost(const GPTConfig& c, int64_t T) {
  if (T <= 0) T = c.block_size;
  const double d = static_cast<double>(c.n_embd), hd = static_cast<double>(c.head_dim());
  const double q = static_cast<double>(c.n_head) * hd, kv = static_cast<double>(c.n_kv_head) * hd;
  const double hid = static_cast<double>(c.mlp_hidden), V = static_cast<double>(c.vocab_size);
  const double L = static_cast<double>(c.n_layer), b = c.bias ? 1 : 0;
  const double norm = c.norm == NormKind::LayerNorm && c.bias ? 2 * d : d;
  const bool swiglu = c.mlp == MlpKind::SwiGLU;
  const double qkv_b = c.bias || c.qkv_bias ? 1 : 0;
  const double attn_p = d * q + 2 * d * kv + q * d + qkv_b * (q + 2 * kv) + b * d;
  const double mlp_p = swiglu ? 3 * d * hid + b * (2 * hid + d) : 2 * d * hid + b * (hid + d);
  ModelCost m{};
  m.params = saturate(V * d + (c.pos == PosKind::Learned ? static_cast<double>(c.block_size) * d : 0) +
                      L * (2 * norm + attn_p + mlp_p) + norm + (c.tie_embeddings ? 0 : V * d));
  const double attn_mm = 2.0 * (d * q + 2 * d * kv + q * d), mlp_mm = 2.0 * (swiglu ? 3 : 2) * d * hid;
  const double attn_core = 4.0 * static_cast<double>(T) * q;
  m.forward_flops_per_token = L * (attn_mm + mlp_mm + attn_core) + 2.0 * d * V;
  m.train_flops_per_token = 3.0 * m.forward_flops_per_token;
  m.kv_cache_bytes_per_token = saturate(2 * L * kv * static_cast<double>(sizeof(float)));
  return m;
}

double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string name;
    double kb = 0;
    if (s >> name >> kb && name == "MemAvailable:") return kb * 1024;
  }
  return static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

std::string byte_size_str(double bytes) {
  static const char* units[] = {"bytes", "KB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, u++;
  char b[64];
  std::snprintf(b, sizeof b, u == 0 ? "%.0f %s" : "%.3g %s", bytes, units[u]);
  return b;
}

void check_memory(double need, double available, const std::string& what) {
  if (need > available)
    throw Error(ErrorKind::config, what + " needs " + byte_size_str(need) + ", more than the " + byte_size_str(available) +
                    " of memory available");
}

}  // namespace tapelm
