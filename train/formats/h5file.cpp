#include "train/formats/h5file.h"

#include "autograd/float16.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <new>

#include "data/io.h"

namespace tapelm {

static_assert(std::is_same_v<hid_t, int64_t>, "HDF5 >= 1.10 is required (64-bit hid_t)");

namespace {

// Guards a dataset's element count against corrupted dimensions before allocating.
constexpr int64_t max_elements = int64_t{1} << 40;

// Silences HDF5's own error printing; per thread, as thread-safe builds keep error state per thread.
void init_hdf5() {
  thread_local const bool done = [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

/// Owns any HDF5 identifier (file, group, dataset, dataspace, datatype, attribute, property list).
class Handle {
 public:
  explicit Handle(hid_t id = -1) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  hid_t release() { return std::exchange(id_, -1); }
  void reset() {
    if (id_ >= 0) H5Idec_ref(id_);
    id_ = -1;
  }

 private:
  hid_t id_;
};

herr_t innermost_error(unsigned, const H5E_error2_t* e, void* out) {
  if (e->desc && *e->desc) *static_cast<std::string*>(out) = e->desc;
  return 0;
}

/// ": <HDF5's innermost error description>" for the last failed call, or "". Must run before any
/// other HDF5 call, since each API call clears the error stack.
std::string h5_detail() {
  std::string desc;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, innermost_error, &desc);
  return desc.empty() ? "" : ": " + desc;
}

/// "/a/b" from "a/b", "/a//b/" or "/a/b"; "" becomes "/".
std::string norm(const std::string& obj) {
  std::string p = "/";
  for (char c : obj)
    if (c != '/' || p.back() != '/') p += c;
  if (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string parent_of(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == 0 ? "/" : p.substr(0, slash);
}

std::string type_name(hid_t type) {
  size_t bits = 8 * H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT: return "float" + std::to_string(bits);
    case H5T_STRING: return "string";
    case H5T_ENUM: return "enum (bool?)";
    case H5T_COMPOUND: return "compound";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    case H5T_OPAQUE: return "opaque";
    case H5T_BITFIELD: return "bitfield";
    case H5T_REFERENCE: return "reference";
    default: return "unknown type";
  }
}

// Chunks of up to this many bytes: a parameter of up to 1 MiB is one chunk, larger ones are cut
// into blocks of whole rows where they can be, so reading a whole dataset stays sequential.
constexpr size_t max_chunk_bytes = size_t{1} << 20;

/// Chunk dimensions for a dataset of `dims`: the whole dataset, or leading dimensions halved (the
/// leftmost first) until a chunk fits max_chunk_bytes.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims, size_t elem_size) {
  std::vector<hsize_t> c = dims;
  auto bytes = [&] {
    size_t n = elem_size;
    for (hsize_t d : c) n *= static_cast<size_t>(d);
    return n;
  };
  for (size_t i = 0; i < c.size() && bytes() > max_chunk_bytes;)
    if (c[i] > 1)
      c[i] = (c[i] + 1) / 2;
    else
      i++;
  return c;
}

/// The creation properties of every dataset written: no timestamps in object headers (as h5py
/// does, so equal content gives equal files), and for a non-empty array a chunked layout with
/// HDF5's Fletcher-32 filter, so a corrupted chunk fails its read instead of loading garbage.
/// Scalars and empty arrays cannot be chunked and stay contiguous.
Handle dataset_create_plist(const std::vector<hsize_t>& dims, size_t elem_size, const std::string& prefix) {
  Handle p(H5Pcreate(H5P_DATASET_CREATE));
  if (!p.ok() || H5Pset_obj_track_times(p.get(), false) < 0) throw Error(ErrorKind::checkpoint, prefix + h5_detail());
  const bool empty = std::find(dims.begin(), dims.end(), hsize_t{0}) != dims.end();
  if (dims.empty() || empty) return p;
  const std::vector<hsize_t> chunk = chunk_dims(dims, elem_size);
  if (H5Pset_chunk(p.get(), static_cast<int>(chunk.size()), chunk.data()) < 0 || H5Pset_fletcher32(p.get()) < 0)
    throw Error(ErrorKind::checkpoint, prefix + h5_detail());
  return p;
}

/// A dataset opened for reading, with its type and extent.
struct Dataset {
  Handle ds, type;
  Shape shape;
  int64_t numel = 0;
};

/// Owns a vlen string HDF5 allocated during a read.
struct H5String {
  char* s = nullptr;
  ~H5String() {
    if (s) H5free_memory(s);
  }
};

}  // namespace

H5File& H5File::operator=(H5File&& o) noexcept {
  if (this != &o) {
    if (id_ >= 0) H5Fclose(id_);
    id_ = std::exchange(o.id_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

void H5File::fail(const std::string& what) const { throw Error(ErrorKind::checkpoint, path_ + ": " + what); }

H5File H5File::open_read(const std::string& path) {
  init_hdf5();
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(ErrorKind::checkpoint, path + ": " + (errno == ENOENT ? std::string("no such file") : std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) throw Error(ErrorKind::checkpoint, path + ": is a directory, not an HDF5 file");
  // opening a FIFO blocks until a writer comes, and a device never ends: regular files only
  if (!S_ISREG(st.st_mode)) throw Error(ErrorKind::checkpoint, path + ": not a regular file (a FIFO, device or socket)");
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(ErrorKind::checkpoint, path + ": cannot read: " + std::strerror(errno));
  ::close(fd);
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) throw Error(ErrorKind::checkpoint, path + ": not an HDF5 file (or truncated/corrupted)" + h5_detail());
  return H5File(id, path);
}

H5File H5File::create(const std::string& path, const std::string& shown) {
  init_hdf5();
  // The 1.10 file format: its superblock, object headers, attribute heaps and chunk indexes carry
  // checksums, so a corrupted file is an error when read instead of a crash inside the library
  // (the default, oldest format has none: a flipped byte in its global heap crashes H5Aread).
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.ok() || H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0)
    throw Error(ErrorKind::checkpoint, path + ": cannot set the HDF5 file format" + h5_detail());
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) throw Error(ErrorKind::checkpoint, (shown.empty() ? path : shown) + ": cannot create HDF5 file" + h5_detail());
  return H5File(id, shown.empty() ? path : shown);
}

bool H5File::exists(const std::string& obj) const {
  if (id_ < 0) fail("file is closed");
  init_hdf5();  // every object access passes here, whichever thread it runs on
  const std::string p = norm(obj);
  if (p == "/") return true;
  // H5Lexists needs every intermediate group to exist, so test the prefixes in order.
  for (size_t end = p.find('/', 1);; end = p.find('/', end + 1)) {
    if (H5Lexists(id_, p.substr(0, end).c_str(), H5P_DEFAULT) <= 0) return false;
    if (end == std::string::npos) break;
  }
  return H5Oexists_by_name(id_, p.c_str(), H5P_DEFAULT) > 0;  // false for a dangling soft link
}

int64_t H5File::open_object(const std::string& obj) const {
  const std::string p = norm(obj);
  if (!exists(p)) fail("missing object " + p);
  hid_t id = H5Oopen(id_, p.c_str(), H5P_DEFAULT);
  if (id < 0) fail("cannot open " + p + h5_detail());
  return id;
}

int64_t H5File::open_dataset(const std::string& obj) const {
  const std::string p = norm(obj);
  if (!exists(p)) fail("missing dataset " + p);
  Handle o(open_object(p));
  if (H5Iget_type(o.get()) != H5I_DATASET) fail(p + " is a group, expected a dataset");
  return o.release();
}

int64_t H5File::open_attr(const std::string& obj, const std::string& name) const {
  const std::string p = norm(obj);
  Handle o(open_object(p));
  htri_t has = H5Aexists(o.get(), name.c_str());
  if (has < 0) fail("cannot read attributes of " + p + h5_detail());
  if (has == 0) fail("missing attribute " + name + " on " + p);
  hid_t a = H5Aopen(o.get(), name.c_str(), H5P_DEFAULT);
  if (a < 0) fail("cannot open attribute " + name + " on " + p + h5_detail());
  return a;
}

std::vector<std::string> H5File::list(const std::string& group) const {
  const std::string p = norm(group);
  if (!exists(p)) fail("missing group " + p);
  Handle g(open_object(p));
  if (H5Iget_type(g.get()) != H5I_GROUP) fail(p + " is a dataset, expected a group");
  std::vector<std::string> names;
  auto add = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    try {
      static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    } catch (...) {
      return -1;
    }
    return 0;
  };
  if (H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, add, &names) < 0)
    fail("cannot list group " + p + h5_detail());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> H5File::list_datasets_recursive(const std::string& group) const {
  const std::string p = norm(group);
  if (!exists(p)) fail("missing group " + p);
  Handle g(open_object(p));
  if (H5Iget_type(g.get()) != H5I_GROUP) fail(p + " is a dataset, expected a group");
  // H5Lvisit follows hard links only and enters each group once, so cycles cannot loop.
  std::vector<std::string> names;
  auto add = [](hid_t grp, const char* name, const H5L_info_t* info, void* out) -> herr_t {
    if (info->type != H5L_TYPE_HARD) return 0;
    Handle o(H5Oopen(grp, name, H5P_DEFAULT));
    if (!o.ok()) return -1;
    try {
      if (H5Iget_type(o.get()) == H5I_DATASET) static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    } catch (...) {
      return -1;  // never unwind through HDF5's C frames
    }
    return 0;
  };
  if (H5Lvisit(g.get(), H5_INDEX_NAME, H5_ITER_INC, add, &names) < 0)
    fail("cannot list datasets below " + p + h5_detail());
  std::sort(names.begin(), names.end());
  return names;
}

void H5File::create_group(const std::string& group) {
  const std::string p = norm(group);
  if (exists(p)) {
    Handle o(open_object(p));
    if (H5Iget_type(o.get()) != H5I_GROUP) fail("cannot create group " + p + ": a dataset has that name");
    return;
  }
  create_group(parent_of(p));
  Handle g(H5Gcreate2(id_, p.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!g.ok()) fail("cannot create group " + p + h5_detail());
}

namespace {

/// Throws "<prefix> <what>", where prefix names the file and the object.
[[noreturn]] void raise(const std::string& prefix, const std::string& what) { throw Error(ErrorKind::checkpoint, prefix + " " + what); }

/// The extent of a dataspace as a Shape.
Shape space_shape(hid_t space, const std::string& prefix) {
  switch (H5Sget_simple_extent_type(space)) {
    case H5S_SCALAR: return {};
    case H5S_SIMPLE: break;
    case H5S_NULL: raise(prefix, "has no data (null dataspace)");
    default: raise(prefix, "has an unreadable dataspace" + h5_detail());
  }
  int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) raise(prefix, "has an unreadable dataspace" + h5_detail());
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0)
    raise(prefix, "has an unreadable dataspace" + h5_detail());
  Shape shape;
  int64_t n = 1;
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(max_elements) || (d > 0 && n > max_elements / static_cast<int64_t>(d)))
      raise(prefix, "has an implausible size (corrupted?)");
    shape.push_back(static_cast<int64_t>(d));
    n *= static_cast<int64_t>(d);
  }
  return shape;
}

}  // namespace

Shape H5File::dataset_shape(const std::string& obj) const {
  const std::string p = norm(obj);
  Handle ds(open_dataset(p));
  Handle space(H5Dget_space(ds.get()));
  if (!space.ok()) fail("cannot read the dataspace of " + p + h5_detail());
  return space_shape(space.get(), path_ + ": " + p);
}

namespace {

/// Takes ownership of an open dataset and reads its type and extent.
Dataset open_for_read(hid_t ds_id, const std::string& prefix) {
  Dataset d;
  d.ds = Handle(ds_id);
  d.type = Handle(H5Dget_type(ds_id));
  if (!d.type.ok()) raise(prefix, "has an unreadable datatype" + h5_detail());
  Handle space(H5Dget_space(ds_id));
  if (!space.ok()) raise(prefix, "has an unreadable dataspace" + h5_detail());
  d.shape = space_shape(space.get(), prefix);
  d.numel = shape_numel(d.shape);
  return d;
}

/// Runs make(), turning an allocation failure (say, from corrupted dimensions) into an checkpoint Error.
template <class Make>
auto allocate(const std::string& prefix, const Shape& shape, const Make& make) {
  try {
    return make();
  } catch (const std::bad_alloc&) {
    raise(prefix, "is too large to read: shape " + shape_str(shape));
  }
}

}  // namespace

Tensor H5File::read_tensor(const std::string& obj) const {
  const std::string p = norm(obj);
  const Shape shape = dataset_shape(p);
  Tensor t = allocate(path_ + ": " + p, shape, [&] { return Tensor::empty(shape); });
  read_tensor_into(p, t.data(), t.numel());
  return t;
}

void H5File::read_tensor_into(const std::string& obj, float* out, int64_t numel) const {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": " + p;
  Dataset d = open_for_read(open_dataset(p), prefix);
  H5T_class_t cls = H5Tget_class(d.type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    raise(prefix, "is " + type_name(d.type.get()) + ", expected a numeric dataset");
  if (d.numel != numel) raise(prefix, "holds " + std::to_string(d.numel) + " values, not " + std::to_string(numel));
  const std::string enc = tensor_encoding(p);
  if (enc == "BF16" || enc == "F16") {  // 16-bit floats stored as their bits: widened
    std::vector<uint16_t> bits = allocate(prefix, d.shape, [&] { return std::vector<uint16_t>(static_cast<size_t>(d.numel)); });
    if (d.numel > 0 && H5Dread(d.ds.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data()) < 0)
      fail("cannot read dataset " + p + h5_detail());
    for (int64_t i = 0; i < d.numel; i++) out[i] = enc == "BF16" ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
    return;
  }
  if (d.numel > 0 && H5Dread(d.ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    fail("cannot read dataset " + p + h5_detail());
}

std::string H5File::tensor_encoding(const std::string& obj) const {
  if (!has_attr(obj, "encoding")) return "F32";
  const std::string p = norm(obj), e = read_attr_string(p, "encoding");
  Handle ds(open_dataset(p));
  Handle type(H5Dget_type(ds.get()));
  const bool u16 = type.ok() && H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_size(type.get()) == 2 &&
                   H5Tget_sign(type.get()) == H5T_SGN_NONE;
  if ((e != "bf16" && e != "f16") || !u16)
    fail(p + ": encoding \"" + e.substr(0, 40) + "\" on a " + (type.ok() ? type_name(type.get()) : std::string("?")) +
         " dataset (tapelm writes bf16 or f16 on unsigned 16-bit integers)");
  return e == "bf16" ? "BF16" : "F16";
}

void H5File::write_tensor_16(const std::string& obj, const Tensor& t, const std::string& encoding) {
  if (!t.defined()) fail("cannot write " + norm(obj) + ": undefined tensor");
  if (encoding != "bf16" && encoding != "f16") fail("cannot write " + norm(obj) + ": no 16-bit encoding " + encoding);
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); i++) {
    bits[i] = encoding == "bf16" ? f32_to_bf16(t[i]) : f32_to_f16(t[i]);
    if (encoding == "f16" && (bits[i] & 0x7c00u) == 0x7c00u)
      throw Error(ErrorKind::data, path_ + ": " + norm(obj) + " holds " + std::to_string(t[i]) + " at element " + std::to_string(i) +
                                       ", beyond f16's range (65504): write it as bf16 or f32");
  }
  write_dataset(obj, t.shape(), H5T_STD_U16LE, H5T_NATIVE_UINT16, bits.data());
  write_attr(obj, "encoding", encoding);
}

void H5File::write_bf16_bits(const std::string& obj, const uint16_t* bits, const Shape& shape) {
  write_dataset(obj, shape, H5T_STD_U16LE, H5T_NATIVE_UINT16, bits);
  write_attr(obj, "encoding", std::string("bf16"));
}

void H5File::write_dataset(const std::string& obj, const Shape& shape, int64_t file_type, int64_t mem_type,
                           const void* data) {
  const std::string p = norm(obj);
  if (id_ < 0) fail("file is closed");
  if (p == "/") fail("cannot write a dataset at /");
  std::vector<hsize_t> dims;
  for (int64_t d : shape) {
    if (d < 0) fail("cannot write " + p + ": negative dimension in shape " + shape_str(shape));
    dims.push_back(static_cast<hsize_t>(d));
  }
  create_group(parent_of(p));
  if (exists(p)) {
    if (H5Iget_type(Handle(open_object(p)).get()) != H5I_DATASET)
      fail("cannot write dataset " + p + ": a group has that name");
    if (H5Ldelete(id_, p.c_str(), H5P_DEFAULT) < 0) fail("cannot replace " + p + h5_detail());
  }
  Handle space(dims.empty() ? H5Screate(H5S_SCALAR)
                            : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  if (!space.ok()) fail("cannot create the dataspace for " + p + h5_detail());
  Handle dcpl = dataset_create_plist(dims, H5Tget_size(file_type), path_ + ": cannot set up dataset " + p);
  Handle ds(H5Dcreate2(id_, p.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!ds.ok()) fail("cannot create dataset " + p + h5_detail());
  if (shape_numel(shape) > 0 && H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail("cannot write dataset " + p + h5_detail());
}

void H5File::write_tensor(const std::string& obj, const Tensor& t) {
  if (!t.defined()) fail("cannot write " + norm(obj) + ": undefined tensor");
  write_dataset(obj, t.shape(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, t.data());
}

std::vector<int32_t> H5File::read_ints(const std::string& obj, Shape* shape) const {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": " + p;
  Dataset d = open_for_read(open_dataset(p), prefix);
  if (H5Tget_class(d.type.get()) != H5T_INTEGER)
    raise(prefix, "is " + type_name(d.type.get()) + ", expected an integer dataset");
  auto out = allocate(prefix, d.shape, [&] { return std::vector<int32_t>(static_cast<size_t>(d.numel)); });
  size_t size = H5Tget_size(d.type.get());
  bool is_signed = H5Tget_sign(d.type.get()) != H5T_SGN_NONE;
  if (d.numel == 0) {
    // nothing to read
  } else if (size < 4 || (size == 4 && is_signed)) {
    if (H5Dread(d.ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
      fail("cannot read dataset " + p + h5_detail());
  } else {
    // Wider types: read as 64-bit and check the range, since HDF5 would silently clamp.
    const bool u64 = !is_signed && size == 8;
    auto wide = allocate(prefix, d.shape, [&] { return std::vector<int64_t>(out.size()); });
    if (H5Dread(d.ds.get(), u64 ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                wide.data()) < 0)
      fail("cannot read dataset " + p + h5_detail());
    for (size_t i = 0; i < wide.size(); i++) {
      bool fits = u64 ? static_cast<uint64_t>(wide[i]) <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
                      : std::in_range<int32_t>(wide[i]);
      if (!fits) {
        std::string v = u64 ? std::to_string(static_cast<uint64_t>(wide[i])) : std::to_string(wide[i]);
        raise(prefix, "has value " + v + " at index " + std::to_string(i) + ", which does not fit in int32");
      }
      out[i] = static_cast<int32_t>(wide[i]);
    }
  }
  if (shape) *shape = d.shape;
  return out;
}

void H5File::write_ints(const std::string& obj, const std::vector<int32_t>& v, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (static_cast<int64_t>(v.size()) != n)
    fail("cannot write " + norm(obj) + ": " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  write_dataset(obj, shape, H5T_STD_I32LE, H5T_NATIVE_INT32, v.data());
}

std::vector<uint8_t> H5File::read_bytes(const std::string& obj) const {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": " + p;
  Dataset d = open_for_read(open_dataset(p), prefix);
  if (H5Tget_class(d.type.get()) != H5T_INTEGER || H5Tget_size(d.type.get()) != 1)
    raise(prefix, "is " + type_name(d.type.get()) + ", expected a uint8 dataset");
  if (d.shape.size() != 1) raise(prefix, "has shape " + shape_str(d.shape) + ", expected a 1-D byte array");
  auto out = allocate(prefix, d.shape, [&] { return std::vector<uint8_t>(static_cast<size_t>(d.numel)); });
  // Reading as the stored type keeps int8 bit patterns instead of clamping them.
  if (d.numel > 0 && H5Dread(d.ds.get(), d.type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    fail("cannot read dataset " + p + h5_detail());
  return out;
}

void H5File::write_bytes(const std::string& obj, const std::vector<uint8_t>& v) {
  write_dataset(obj, {static_cast<int64_t>(v.size())}, H5T_STD_U8LE, H5T_NATIVE_UINT8, v.data());
}

bool H5File::has_attr(const std::string& obj, const std::string& name) const {
  const std::string p = norm(obj);
  if (!exists(p)) return false;
  Handle o(open_object(p));
  htri_t has = H5Aexists(o.get(), name.c_str());
  if (has < 0) fail("cannot read attributes of " + p + h5_detail());
  return has > 0;
}

namespace {

/// An attribute opened for reading a single value.
struct Attr {
  Handle attr, type;
};

/// The attribute and its datatype; *n receives its element count.
Attr open_attr_elements(hid_t attr_id, const std::string& prefix, hssize_t* n) {
  Attr a{Handle(attr_id), Handle(H5Aget_type(attr_id))};
  if (!a.type.ok()) raise(prefix, "has an unreadable datatype" + h5_detail());
  Handle space(H5Aget_space(attr_id));
  if (!space.ok()) raise(prefix, "has an unreadable dataspace" + h5_detail());
  *n = H5Sget_simple_extent_npoints(space.get());
  if (*n < 0) raise(prefix, "has an unreadable dataspace" + h5_detail());
  return a;
}

Attr open_scalar_attr(hid_t attr_id, const std::string& prefix) {
  hssize_t n = 0;
  Attr a = open_attr_elements(attr_id, prefix, &n);
  if (n != 1) raise(prefix, "has " + std::to_string(n) + " elements, expected one");
  return a;
}

}  // namespace

std::string H5File::read_attr_string(const std::string& obj, const std::string& name) const {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": attribute " + name + " on " + p;
  Attr a = open_scalar_attr(open_attr(p, name), prefix);
  hid_t type = a.type.get();
  if (H5Tget_class(type) != H5T_STRING) raise(prefix, "is " + type_name(type) + ", expected a string");
  if (H5Tis_variable_str(type) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1));
    if (!mem.ok() || H5Tset_size(mem.get(), H5T_VARIABLE) < 0 || H5Tset_cset(mem.get(), H5Tget_cset(type)) < 0)
      raise(prefix, "cannot be read" + h5_detail());
    H5String s;
    if (H5Aread(a.attr.get(), mem.get(), &s.s) < 0) raise(prefix, "cannot be read" + h5_detail());
    return s.s ? std::string(s.s) : std::string();
  }
  // Fixed-length: read the bytes as stored and strip the padding ourselves.
  size_t size = H5Tget_size(type);
  if (size == 0) raise(prefix, "has an unreadable datatype" + h5_detail());
  std::string s(size, '\0');
  if (H5Aread(a.attr.get(), type, s.data()) < 0) raise(prefix, "cannot be read" + h5_detail());
  if (H5Tget_strpad(type) == H5T_STR_SPACEPAD) {
    s.erase(s.find_last_not_of(' ') + 1);
  } else {
    s.resize(std::strlen(s.c_str()));
  }
  return s;
}

int64_t H5File::read_attr_int(const std::string& obj, const std::string& name) const {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": attribute " + name + " on " + p;
  Attr a = open_scalar_attr(open_attr(p, name), prefix);
  hid_t type = a.type.get();
  if (H5Tget_class(type) != H5T_INTEGER) raise(prefix, "is " + type_name(type) + ", expected an integer");
  if (H5Tget_sign(type) == H5T_SGN_NONE && H5Tget_size(type) == 8) {
    uint64_t u = 0;
    if (H5Aread(a.attr.get(), H5T_NATIVE_UINT64, &u) < 0) raise(prefix, "cannot be read" + h5_detail());
    if (!std::in_range<int64_t>(u)) raise(prefix, "has value " + std::to_string(u) + ", which does not fit in int64");
    return static_cast<int64_t>(u);
  }
  int64_t v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_INT64, &v) < 0) raise(prefix, "cannot be read" + h5_detail());
  return v;
}

double H5File::read_attr_double(const std::string& obj, const std::string& name) const {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": attribute " + name + " on " + p;
  Attr a = open_scalar_attr(open_attr(p, name), prefix);
  hid_t type = a.type.get();
  H5T_class_t cls = H5Tget_class(type);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) raise(prefix, "is " + type_name(type) + ", expected a number");
  double v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, &v) < 0) raise(prefix, "cannot be read" + h5_detail());
  return v;
}

std::vector<double> H5File::read_attr_doubles(const std::string& obj, const std::string& name) const {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": attribute " + name + " on " + p;
  hssize_t n = 0;
  Attr a = open_attr_elements(open_attr(p, name), prefix, &n);
  hid_t type = a.type.get();
  H5T_class_t cls = H5Tget_class(type);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) raise(prefix, "is " + type_name(type) + ", expected numbers");
  std::vector<double> v(static_cast<size_t>(n));
  if (n > 0 && H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, v.data()) < 0) raise(prefix, "cannot be read" + h5_detail());
  return v;
}

namespace {

/// Replaces attribute `name` on `obj_id` with a scalar of `file_type` holding *value.
void put_scalar_attr(hid_t obj_id, const std::string& name, hid_t file_type, hid_t mem_type, const void* value,
                     const std::string& prefix) {
  htri_t has = H5Aexists(obj_id, name.c_str());
  if (has < 0) raise(prefix, "cannot be written" + h5_detail());
  if (has > 0 && H5Adelete(obj_id, name.c_str()) < 0) raise(prefix, "cannot be replaced" + h5_detail());
  Handle space(H5Screate(H5S_SCALAR));
  if (!space.ok()) raise(prefix, "cannot be written" + h5_detail());
  Handle attr(H5Acreate2(obj_id, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.ok()) raise(prefix, "cannot be created" + h5_detail());
  if (H5Awrite(attr.get(), mem_type, value) < 0) raise(prefix, "cannot be written" + h5_detail());
}

}  // namespace

void H5File::write_attr(const std::string& obj, const std::string& name, const std::string& v) {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": attribute " + name + " on " + p;
  if (v.find('\0') != std::string::npos) raise(prefix, "cannot hold a NUL character");
  Handle o(open_object(p));
  // Fixed-length: the bytes live in the attribute itself, under the object header's checksum, not
  // in the global heap that variable-length strings point into (h5py reads both kinds as str).
  Handle type(H5Tcopy(H5T_C_S1));
  if (!type.ok() || H5Tset_size(type.get(), std::max<size_t>(1, v.size())) < 0 ||
      H5Tset_strpad(type.get(), H5T_STR_NULLPAD) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    raise(prefix, "cannot be written" + h5_detail());
  put_scalar_attr(o.get(), name, type.get(), type.get(), v.data(), prefix);
}

void H5File::write_attr(const std::string& obj, const std::string& name, int64_t v) {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": attribute " + name + " on " + p;
  Handle o(open_object(p));
  put_scalar_attr(o.get(), name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, prefix);
}

void H5File::write_attr(const std::string& obj, const std::string& name, double v) {
  const std::string p = norm(obj);
  const std::string prefix = path_ + ": attribute " + name + " on " + p;
  Handle o(open_object(p));
  put_scalar_attr(o.get(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, prefix);
}

void H5File::flush() {
  if (id_ < 0) fail("file is closed");
  init_hdf5();
  if (H5Fflush(id_, H5F_SCOPE_GLOBAL) < 0) fail("cannot flush" + h5_detail());
}

void H5File::close() {
  if (id_ < 0) return;
  init_hdf5();
  if (H5Fclose(std::exchange(id_, -1)) < 0) fail("cannot close" + h5_detail());
}

void write_h5_atomic(const std::string& path, const std::function<void(H5File&)>& fill) {
  commit_files({{path, [&](const std::string& tmp) {
                   H5File f = H5File::create(tmp, path);
                   fill(f);
                   if (f.is_open()) {
                     f.flush();
                     f.close();
                   }
                 }}});
}

}  // namespace tapelm
