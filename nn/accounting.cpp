#include "nn/accounting.h"

#include <sys/resource.h>
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
  // kv_all: the key/value width summed over the layers (they may differ)
  const double q = static_cast<double>(c.n_head) * hd, kv_all = static_cast<double>(c.total_kv_heads()) * hd;
  const double hid = static_cast<double>(c.mlp_hidden), V = static_cast<double>(c.vocab_size);
  const double L = static_cast<double>(c.n_layer), b = c.bias ? 1 : 0;
  const double norm = c.norm == NormKind::LayerNorm && c.bias ? 2 * d : d;
  const bool swiglu = c.gated();
  const double qkv_b = c.bias || c.qkv_bias ? 1 : 0;
  const double attn_p = d * q + q * d + qkv_b * q + b * d, kv_p = 2 * d + 2 * qkv_b;  // per layer; per key/value column
  const double mlp_p = swiglu ? 3 * d * hid + b * (2 * hid + d) : 2 * d * hid + b * (hid + d);
  // q_norm and k_norm: hd each per layer (per head), or the projections' widths (over them all)
  const double qk_norm = c.qk_norm == QkNorm::head ? L * 2 * hd : c.qk_norm == QkNorm::all ? L * q + kv_all : 0;
  ModelCost m{};
  m.params = saturate(V * d + (c.pos == PosKind::Learned ? static_cast<double>(c.block_size) * d : 0) +
                      L * (2 * norm + attn_p + mlp_p) + kv_p * kv_all + qk_norm + norm + (c.tie_embeddings ? 0 : V * d));
  const double attn_mm = 2.0 * (d * q + q * d), kv_mm = 4.0 * d * kv_all, mlp_mm = 2.0 * (swiglu ? 3 : 2) * d * hid;
  const double attn_core = 4.0 * static_cast<double>(T) * q;
  m.forward_flops_per_token = L * (attn_mm + mlp_mm + attn_core) + kv_mm + 2.0 * d * V;
  m.train_flops_per_token = 3.0 * m.forward_flops_per_token;
  m.kv_cache_bytes_per_token = kv_cache_bytes_per_token(c, KvType::f32);
  m.attention_params = saturate(L * attn_p + kv_p * kv_all + qk_norm);
  m.kv_params = saturate(kv_p * kv_all);
  m.matmul_weights = saturate(L * (d * q + q * d + (swiglu ? 3 : 2) * d * hid) + 2 * d * kv_all + d * V);
  return m;
}

int64_t kv_cache_bytes_per_token(const GPTConfig& c, KvType t) {
  return saturate(2.0 * static_cast<double>(c.total_kv_heads()) * static_cast<double>(kv_row_bytes(t, c.head_dim())));
}

namespace {
// The first number after `key` in a /proc-style file of "key value" lines (kB units), or -1.
double proc_field_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string name;
    double kb = 0;
    if (s >> name >> kb && name == key) return kb;
  }
  return -1;
}
// A one-number file (cgroup v2's memory.max, memory.current): its value, or -1 ("max", absent).
double file_number(const std::string& path) {
  std::ifstream in(path);
  double v = -1;
  if (!(in >> v)) return -1;
  return v;
}
// This process's cgroup v2 directory ("0::/path" in /proc/self/cgroup).
std::string cgroup_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  return "";
}
}  // namespace

bool address_space_limited() {
  rlimit lim{};
  return ::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY;
}

double available_memory_bytes() {
  const double kb = proc_field_kb("/proc/meminfo", "MemAvailable:");
  double avail = kb >= 0 ? kb * 1024
                         : static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  // A container's limit (cgroup v2), less what the group already uses.
  const std::string cg = cgroup_dir();
  if (!cg.empty()) {
    const double max = file_number(cg + "/memory.max"), cur = file_number(cg + "/memory.current");
    if (max >= 0 && cur >= 0) avail = std::min(avail, std::max(0.0, max - cur));
  }
  // An address-space limit (ulimit -v), less the address space already mapped.
  rlimit lim{};
  if (::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const double vm = std::max(0.0, proc_field_kb("/proc/self/status", "VmSize:")) * 1024;
    avail = std::min(avail, std::max(0.0, static_cast<double>(lim.rlim_cur) - vm));
  }
  return avail;
}

double prefill_bytes(const GPTConfig& c, int64_t batch, int64_t T, int threads) {
  const double rows = static_cast<double>(batch) * static_cast<double>(T);
  const double per_row = 7.0 * static_cast<double>(c.n_embd) + 3.0 * static_cast<double>(c.mlp_hidden);
  return 4.0 * (rows * per_row + static_cast<double>(threads) * 32.0 * static_cast<double>(T) +
                static_cast<double>(batch) * static_cast<double>(c.vocab_size));
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
