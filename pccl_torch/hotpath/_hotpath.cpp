// The compiled hot path of pccl's small host collectives (see pccl_torch/hotpath/__init__.py).
//
// A call of a shape already bound to MPI's own collective (pccl_torch.calls: flat `mpi` plan, host tensors,
// no checking, blocking) does here, in C, what the Python layers would: find the bound shape, re-check what
// can differ between calls of one shape (dense, contiguous, on the CPU, dtype, aliasing), number the call,
// run MPI's collective (persistent over staging copies, blocking, or started and polled) and count it. Every
// other call, and every call this code is not sure of, goes to the Python implementation unchanged
// (`fallback`), which validates, chooses, binds and raises as before. Python owns every MPI object (mpi4py's
// communicators, datatypes, ops and persistent requests); this file only holds their handles.
//
// It also records pccl's profiler ranges (pccl_torch/profiling.py), its own calls' and, for the Python path,
// those of every other call: `record_param_comms` and `pccl:<collective>`, with ATen's RecordFunction.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <mpi.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

// torch's event of a collective's parameters (`record_param_comms`, what ProcessGroupNCCL records), with the
// ParamCommsDebugInfo of the torch this was written against (2.13); with an older torch only pccl's own range.
#if __has_include(<torch/headeronly/version.h>) && __has_include(<torch/csrc/distributed/c10d/ParamCommsUtils.hpp>)
#include <torch/headeronly/version.h>
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>
#define PCCL_PARAM_COMMS 1
#endif
#endif

namespace {

enum Kind : int { ALL_REDUCE = 0, ALL_GATHER = 1, REDUCE_SCATTER = 2, ALL_TO_ALL = 3, KINDS = 4 };

// Polling schedule of a polled wait's fast phase (the transport's _POLLS_PER_CHECK, SPIN_FACTOR, MAX_SPIN_S,
// _TYPICAL_RISE): test-and-yield in batches; past the spin the wait goes back to Python, which naps, watches the
// deadline and the failure notices.
constexpr int POLLS_PER_CHECK = 16;
constexpr double SPIN_FACTOR = 2.0;
constexpr double MAX_SPIN_S = 0.01;
constexpr double TYPICAL_RISE = 1.1;

struct Key {
  int kind;
  int dtype;
  int64_t a;   // numel of the buffer (all-reduce), output (all-gather), input (reduce-scatter, all-to-all)
  int64_t b;   // numel of the other tensor (0 for all-reduce and all-to-all)
  int64_t op;  // the MPI op's handle (0 without one)
  bool operator==(const Key& o) const {
    return kind == o.kind && dtype == o.dtype && a == o.a && b == o.b && op == o.op;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = (uint64_t)k.kind * 0x9E3779B97F4A7C15ULL ^ (uint64_t)k.dtype;
    h = (h ^ (uint64_t)k.a) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (uint64_t)k.b) * 0x94D049BB133111EBULL;
    return (size_t)(h ^ (uint64_t)k.op ^ (h >> 31));
  }
};

struct Bound {
  int kind;
  MPI_Comm comm;
  MPI_Datatype datatype;  // of the reduction (MPI_BYTE for moves)
  MPI_Op op;
  int count;        // elements of the MPI call (all-reduce: all; reduce-scatter: one block; moves: block bytes)
  std::vector<int> counts;  // reduce-scatter: `count` for every rank (MPI_Ireduce_scatter's recvcounts)
  int64_t nbytes;   // the caller's full buffer (what stats() counts)
  int64_t block;    // bytes of one rank's block
  int64_t offset;   // where this rank's block starts in the full buffer (all-gather in place)
  int64_t world;    // ranks of the communicator
  MPI_Request request;  // a persistent collective over the staging buffers, or MPI_REQUEST_NULL
  char* staged_in;
  char* staged_out;
  bool polled;      // start it and poll (PCCL_WAIT polled) instead of a blocking call
  double spin_s;    // the transport's spin floor
  double typical;   // the fastest recent wait (< 0: none yet)
  PyObject* entry;     // the plan's counters, [calls, bytes, seconds]
  PyObject* watch;     // the watchdog's Watch of a blocking call (None when polled)
  PyObject* on_error;  // on_error(code, sequence) -> the exception to raise
  PyObject* on_slow;   // on_slow(request handle, sequence, waited) -> None or the exception to raise
  PyObject* keep;      // whatever owns the staging memory
  PyObject* call;      // the calls.BoundCall: what the flight recorder's records name
  int refs;            // the table's, and each call's in progress (a table cleared meanwhile frees it after)
};

// One call in the flight recorder's ring (pccl_torch/flight_recorder.py): written in place, nothing allocated.
struct Rec {
  long long seq;     // the call's sequence number (0: never written)
  PyObject* call;    // its calls.BoundCall (a reference)
  double started;    // now_s() when it started
  double completed;  // now_s() when it completed (0: not yet)
};

typedef struct {
  PyObject_HEAD
  std::unordered_map<Key, Bound*, KeyHash>* map;
  unsigned long long hits;  // calls run here (what tests and `pccl_torch.hotpath.hits` read)
  std::vector<Rec>* ring;   // the flight recorder's ring of the calls run here (nullptr: recording off)
} Table;

typedef struct {
  PyObject_HEAD
  int kind;
  PyObject* fallback;
  PyObject* dict;
  vectorcallfunc vectorcall;
} Entry;

// Set up by setup(): where the default communicator lives, and the reduce ops the hot path knows by identity.
PyObject* g_default_holder = nullptr;  // the communicator module's __dict__
PyObject* g_default_name = nullptr;    // "_DEFAULT"
constexpr int MAX_OPS = 16;
PyObject* g_op_objects[MAX_OPS];
int64_t g_op_handles[MAX_OPS];
int g_ops = 0;
int64_t g_sum = 0;  // MPI_SUM's handle: the op of a call that names none

PyObject *s_hot, *s_broken, *s_sequence, *s_executor, *s_last, *s_since, *s_comm, *s_algorithm,
    *s_compression, *s_async_op, *s_op, *s_output_split_sizes, *s_input_split_sizes;
PyObject* g_zero_float = nullptr;

inline double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // time.perf_counter()'s clock on Linux: the watchdog compares them
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void release(Bound* b) {
  if (--b->refs > 0) return;
  Py_XDECREF(b->entry);
  Py_XDECREF(b->watch);
  Py_XDECREF(b->on_error);
  Py_XDECREF(b->on_slow);
  Py_XDECREF(b->keep);
  Py_XDECREF(b->call);
  delete b;
}

// ---------------------------------------------------------------------------------------------------- Table

int Table_traverse(Table* self, visitproc visit, void* arg) {
  if (self->map) {
    for (auto& kv : *self->map) {
      Bound* b = kv.second;
      Py_VISIT(b->entry);
      Py_VISIT(b->watch);
      Py_VISIT(b->on_error);
      Py_VISIT(b->on_slow);
      Py_VISIT(b->keep);
      Py_VISIT(b->call);
    }
  }
  if (self->ring)
    for (auto& r : *self->ring) Py_VISIT(r.call);
  return 0;
}

int Table_clear_refs(Table* self) {
  if (self->map) {
    auto* map = self->map;
    self->map = new std::unordered_map<Key, Bound*, KeyHash>();
    for (auto& kv : *map) release(kv.second);
    delete map;
  }
  return 0;
}

// Drop the ring's references too (the GC's clear and dealloc; `clear()` keeps the ring: it is history).
int Table_clear_all(Table* self) {
  Table_clear_refs(self);
  if (self->ring)
    for (auto& r : *self->ring) Py_CLEAR(r.call);
  return 0;
}

void Table_dealloc(Table* self) {
  PyObject_GC_UnTrack(self);
  Table_clear_all(self);
  delete self->map;
  self->map = nullptr;
  delete self->ring;
  self->ring = nullptr;
  Py_TYPE(self)->tp_free((PyObject*)self);
}

// Table(trace=0): `trace` slots of the flight recorder's ring (0: no ring).
PyObject* Table_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  Py_ssize_t trace = 0;
  static const char* names[] = {"trace", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", (char**)names, &trace)) return nullptr;
  if (trace < 0) {
    PyErr_SetString(PyExc_ValueError, "trace must be 0 or more slots");
    return nullptr;
  }
  Table* self = (Table*)type->tp_alloc(type, 0);
  if (!self) return nullptr;
  self->map = new std::unordered_map<Key, Bound*, KeyHash>();
  self->ring = trace ? new std::vector<Rec>((size_t)trace, Rec{0, nullptr, 0.0, 0.0}) : nullptr;
  return (PyObject*)self;
}

// trace() -> [(seq, call, started, completed)] of the ring's written slots, in slot order.
PyObject* Table_trace(Table* self, PyObject*) {
  PyObject* out = PyList_New(0);
  if (!out || !self->ring) return out;
  for (const auto& r : *self->ring) {
    if (!r.call) continue;
    PyObject* item = Py_BuildValue("(LOdd)", r.seq, r.call, r.started, r.completed);
    if (!item || PyList_Append(out, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return out;
}

// add(kind, dtype, a, b, op, comm, datatype, mpi_op, count, nbytes, block, offset, world, request, staged_in,
//     staged_out, polled, spin_s, entry, watch, on_error, on_slow, keep, call)
PyObject* Table_add(Table* self, PyObject* args) {
  int kind, polled;
  PyObject *dtype, *entry, *watch, *on_error, *on_slow, *keep, *call;
  long long a, b, count, nbytes, block, offset, world;
  unsigned long long op, comm, datatype, mpi_op, request, staged_in, staged_out;  // handles, addresses: bit masks
  double spin_s;
  if (!PyArg_ParseTuple(args, "iO!LLKKKKLLLLLKKKpdOOOOOO", &kind, &THPDtypeType, &dtype, &a, &b, &op, &comm,
                        &datatype, &mpi_op, &count, &nbytes, &block, &offset, &world, &request, &staged_in,
                        &staged_out,
                        &polled, &spin_s, &entry, &watch, &on_error, &on_slow, &keep, &call))
    return nullptr;
  if (kind < 0 || kind >= KINDS) {
    PyErr_SetString(PyExc_ValueError, "unknown collective kind");
    return nullptr;
  }
  if (!PyList_Check(entry) || PyList_GET_SIZE(entry) != 3) {
    PyErr_SetString(PyExc_TypeError, "entry must be a list [calls, bytes, seconds]");
    return nullptr;
  }
  if (count < 0 || count > INT32_MAX || world < 1) {
    PyErr_SetString(PyExc_ValueError, "count out of MPI's int range");
    return nullptr;
  }
  Key key{kind, (int)((THPDtype*)dtype)->scalar_type, a, b, (int64_t)op};
  Bound* bound = new Bound();
  bound->kind = kind;
  bound->comm = (MPI_Comm)comm;
  bound->datatype = (MPI_Datatype)datatype;
  bound->op = (MPI_Op)mpi_op;
  bound->count = (int)count;
  if (kind == REDUCE_SCATTER) bound->counts.assign((size_t)world, (int)count);
  bound->nbytes = nbytes;
  bound->block = block;
  bound->offset = offset;
  bound->world = world;
  bound->request = (MPI_Request)request;
  bound->staged_in = (char*)(intptr_t)staged_in;
  bound->staged_out = (char*)(intptr_t)staged_out;
  bound->polled = polled != 0;
  bound->spin_s = spin_s;
  bound->typical = -1.0;
  bound->refs = 1;
  Py_INCREF(entry);
  bound->entry = entry;
  Py_INCREF(watch);
  bound->watch = watch;
  Py_INCREF(on_error);
  bound->on_error = on_error;
  Py_INCREF(on_slow);
  bound->on_slow = on_slow;
  Py_INCREF(keep);
  bound->keep = keep;
  Py_INCREF(call);
  bound->call = call;
  auto found = self->map->find(key);
  if (found != self->map->end()) {
    release(found->second);
    found->second = bound;
  } else {
    self->map->emplace(key, bound);
  }
  Py_RETURN_NONE;
}

PyObject* Table_clear(Table* self, PyObject*) {
  Table_clear_refs(self);
  Py_RETURN_NONE;
}

Py_ssize_t Table_len(Table* self) { return self->map ? (Py_ssize_t)self->map->size() : 0; }

PyMethodDef Table_methods[] = {
    {"add", (PyCFunction)Table_add, METH_VARARGS, "Bind a call shape (see pccl_torch.hotpath.register)."},
    {"clear", (PyCFunction)Table_clear, METH_NOARGS, "Forget every bound shape."},
    {"trace", (PyCFunction)Table_trace, METH_NOARGS, "The flight recorder's ring: [(seq, call, started, completed)]."},
    {nullptr, nullptr, 0, nullptr}};

PyObject* Table_get_hits(Table* self, void*) { return PyLong_FromUnsignedLongLong(self->hits); }

PyGetSetDef Table_getset[] = {
    {"hits", (getter)Table_get_hits, nullptr, "Calls the hot path has run for this communicator.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PySequenceMethods Table_as_sequence = {(lenfunc)Table_len};

PyTypeObject TableType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------------------------------------------- profiler

// What a call's ranges say (pccl_torch/profiling.py): the collective, this rank's input and output elements (as
// torch's In and Out msg nelems), the full buffer's bytes (what stats() counts), the plan, the group, the call's
// number and whether it was issued async.
struct CallInfo {
  std::string collective;
  at::ScalarType dtype;
  std::string dtype_name;  // torch's Python name ("float32")
  int64_t in_nelems, out_nelems, nbytes;
  std::string algorithm;
  int64_t group_size, rank, sequence;
  bool async_op;
  std::string group;  // record_param_comms' Process Group Name and Description
};

// A call's ranges while a profiler records, as ProcessGroupNCCL's calls show: `record_param_comms` (torch's
// fields: Collective name, dtype, In/Out msg nelems, Group size, Rank, Seq; in every trace) and inside it
// `pccl:<collective>`, whose keyword arguments (kept where the profiler records shapes) add the bytes and the
// algorithm. Closed innermost first. With no profiler, opening costs one look at the callbacks of each scope.
// As RECORD_PARAM_COMMS's scope does, the parameters (debug info) and inputs stay until record_param_comms ends:
// the profiler reads them as it begins and as it ends.
struct Ranges {
  std::unique_ptr<c10::DebugInfoGuard> info;
  std::vector<c10::IValue> inputs;
  std::unique_ptr<at::RecordFunction> comms, range;

  void open(const CallInfo& c) {
#ifdef PCCL_PARAM_COMMS
    if (auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION)) {
      auto params = std::make_shared<torch::ParamCommsDebugInfo>(
          std::make_tuple(c.group, c.group), (int)c.rank, std::string(c.collective), c.in_nelems, c.out_nelems,
          c.dtype, std::vector<int64_t>(), std::vector<int64_t>(), 0, 1, (int)c.group_size, c.async_op);
      params->setSequenceInfo(c.sequence, false);
      info = std::make_unique<c10::DebugInfoGuard>(c10::DebugInfoKind::PARAM_COMMS_INFO, params);
      comms = std::make_unique<at::RecordFunction>(std::move(*callbacks));
      if (comms->needsInputs()) {  // RECORD_PARAM_COMMS's inputs
        std::initializer_list<const c10::IValue> list = {
            c10::IValue(std::make_tuple(c.sequence, false)), c10::IValue(std::make_tuple(c.group, c.group)),
            c10::IValue(c.rank), c10::IValue(c.collective), c10::IValue(std::vector<int64_t>()),
            c10::IValue(std::vector<int64_t>()), c10::IValue((int64_t)0), c10::IValue((int64_t)1),
            c10::IValue(c.group_size), c10::IValue(c.async_op)};
        inputs.assign(list.begin(), list.end());
        comms->before(at::kParamCommsCallName,
                      c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
      } else {
        comms->before(at::kParamCommsCallName);
      }
    }
#endif
    if (auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE)) {
      range = std::make_unique<at::RecordFunction>(std::move(*callbacks));
      std::string name = "pccl:" + c.collective;
      if (range->needsInputs()) {
        std::unordered_map<std::string, c10::IValue> kwargs{
            {"collective", c.collective}, {"bytes", c.nbytes},       {"dtype", c.dtype_name},
            {"algorithm", c.algorithm},   {"group_size", c.group_size}, {"rank", c.rank},
            {"seq", c.sequence},          {"async_op", c.async_op}};
        range->before(name, c10::ArrayRef<const c10::IValue>(), &kwargs);
      } else {
        range->before(name);
      }
    }
  }

  void close() {
    range.reset();
    comms.reset();
    info.reset();
    inputs.clear();
  }

  ~Ranges() { close(); }
};

// Whether a torch profiler records: torch's flag for fast checks (torch.autograd.profiler._is_profiler_enabled,
// which the Python path reads too), one dictionary look-up, the one check a call pays when none records (about
// 10 ns; asking RecordFunction for its callbacks costs twice that).
PyObject* g_profiler_flags = nullptr;  // torch.autograd.profiler's __dict__ (nullptr: never profiled)
PyObject* s_profiler_enabled = nullptr;

inline bool profiled() {
  return g_profiler_flags && PyDict_GetItemWithError(g_profiler_flags, s_profiler_enabled) == Py_True;
}

// Range(collective, dtype, in_nelems, out_nelems, nbytes, algorithm, group_size, rank, sequence, async_op, group):
// a call's ranges for the Python path (pccl_torch.profiling), open between __enter__ and __exit__ (one thread).
typedef struct {
  PyObject_HEAD
  CallInfo* info;
  Ranges* ranges;
} Range;

PyObject* Range_new(PyTypeObject* type, PyObject* args, PyObject*) {
  const char *collective, *algorithm, *group;
  PyObject* dtype;
  long long in_nelems, out_nelems, nbytes, group_size, rank, sequence;
  int async_op;
  if (!PyArg_ParseTuple(args, "sO!LLLsLLLps", &collective, &THPDtypeType, &dtype, &in_nelems, &out_nelems, &nbytes,
                        &algorithm, &group_size, &rank, &sequence, &async_op, &group))
    return nullptr;
  Range* self = (Range*)type->tp_alloc(type, 0);
  if (!self) return nullptr;
  THPDtype* d = (THPDtype*)dtype;
  self->info = new CallInfo{collective, d->scalar_type, d->name, in_nelems, out_nelems, nbytes, algorithm, group_size,
                            rank, sequence, async_op != 0, group};
  self->ranges = new Ranges();
  return (PyObject*)self;
}

void Range_dealloc(Range* self) {
  delete self->ranges;  // closes what is still open
  delete self->info;
  Py_TYPE(self)->tp_free((PyObject*)self);
}

PyObject* Range_enter(Range* self, PyObject*) {
  try {
    self->ranges->close();
    self->ranges->open(*self->info);
  } catch (const std::exception& exc) {
    self->ranges->close();
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  } catch (...) {
    self->ranges->close();
    PyErr_SetString(PyExc_RuntimeError, "a profiler callback failed opening pccl's ranges");
    return nullptr;
  }
  Py_INCREF(self);
  return (PyObject*)self;
}

PyObject* Range_exit(Range* self, PyObject*) {
  try {
    self->ranges->close();
  } catch (...) {  // an observer's end callback: the call's own outcome stands
  }
  Py_RETURN_FALSE;
}

PyMethodDef Range_methods[] = {
    {"__enter__", (PyCFunction)Range_enter, METH_NOARGS, "Open the call's ranges."},
    {"__exit__", (PyCFunction)Range_exit, METH_VARARGS, "Close them."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject RangeType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ProfilerState(): the calling thread's profiler (its RecordFunction callbacks and debug info, which hold a
// thread-local profiler's state), applied to the thread that enters it until it exits, as torch's own
// at::launch carries them: a call run on the communicator's worker thread records into the caller's profile.
struct ThreadProfiler {
  std::shared_ptr<c10::ThreadLocalDebugInfo> debug_info = c10::ThreadLocalDebugInfo::current();
  at::RecordFunctionTLS callbacks = at::get_record_function_tls_();

  void apply() const {
    c10::ThreadLocalDebugInfo::_forceCurrentDebugInfo(debug_info);
    at::set_record_function_tls_(callbacks);
  }
};

typedef struct {
  PyObject_HEAD
  ThreadProfiler* captured;  // the creating thread's
  ThreadProfiler* saved;     // the entering thread's own, while entered
} ProfilerState;

PyObject* ProfilerState_new(PyTypeObject* type, PyObject*, PyObject*) {
  ProfilerState* self = (ProfilerState*)type->tp_alloc(type, 0);
  if (self) self->captured = new ThreadProfiler();
  return (PyObject*)self;
}

void ProfilerState_restore(ProfilerState* self) {
  if (!self->saved) return;
  self->saved->apply();
  delete self->saved;
  self->saved = nullptr;
}

void ProfilerState_dealloc(ProfilerState* self) {
  ProfilerState_restore(self);
  delete self->captured;
  Py_TYPE(self)->tp_free((PyObject*)self);
}

PyObject* ProfilerState_enter(ProfilerState* self, PyObject*) {
  if (self->saved) {
    PyErr_SetString(PyExc_RuntimeError, "ProfilerState entered twice");
    return nullptr;
  }
  self->saved = new ThreadProfiler();
  self->captured->apply();
  Py_INCREF(self);
  return (PyObject*)self;
}

PyObject* ProfilerState_exit(ProfilerState* self, PyObject*) {
  ProfilerState_restore(self);
  Py_RETURN_FALSE;
}

PyMethodDef ProfilerState_methods[] = {
    {"__enter__", (PyCFunction)ProfilerState_enter, METH_NOARGS, "Apply the captured profiler to this thread."},
    {"__exit__", (PyCFunction)ProfilerState_exit, METH_VARARGS, "Give the thread its own back."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject ProfilerStateType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// The ranges of a hot call (flat `mpi` plan, blocking) while a profiler records; an observer's error leaves the
// call unrecorded, never failed.
void trace(Ranges& ranges, Bound* b, PyObject* first, long long sequence) {
  try {
    at::ScalarType dtype = THPVariable_Unpack(first).scalar_type();
    int64_t elements = b->nbytes / (int64_t)c10::elementSize(dtype);
    int64_t block = elements / b->world;
    int64_t in_nelems = b->kind == ALL_GATHER ? block : elements;
    int64_t out_nelems = b->kind == REDUCE_SCATTER ? block : elements;
    int rank = 0;
    MPI_Comm_rank(b->comm, &rank);
    static const char* names[KINDS] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
    ranges.open(CallInfo{names[b->kind], dtype, torch::getTHPDtype(dtype)->name, in_nelems, out_nelems, b->nbytes,
                         "mpi", b->world, rank, sequence, false, "pccl"});
  } catch (...) {
    ranges.close();
  }
}

// ---------------------------------------------------------------------------------------------------- calls

// What a call's tensor gives the hot path: nullptr when it is not a dense contiguous CPU tensor with storage.
const at::Tensor* host_tensor(PyObject* o) {  // may throw c10::Error: the caller catches it
  if (!THPVariable_Check(o)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (!t.defined() || t.layout() != c10::kStrided || !t.device().is_cpu()) return nullptr;
  if (!t.unsafeGetTensorImpl()->has_storage() || !t.is_contiguous()) return nullptr;
  return &t;
}

inline bool apart(uintptr_t a, int64_t a_bytes, uintptr_t b, int64_t b_bytes) {
  return a_bytes == 0 || b_bytes == 0 || a >= b + (uintptr_t)b_bytes || b >= a + (uintptr_t)a_bytes;
}

int64_t op_handle(PyObject* op) {
  if (op == nullptr) return g_sum;
  for (int i = 0; i < g_ops; ++i)
    if (g_op_objects[i] == op) return g_op_handles[i];
  return 0;
}

// Add `delta` to entry[i] (an int or a float), in place in the list.
inline int bump(PyObject* entry, Py_ssize_t i, PyObject* delta) {
  PyObject* sum = PyNumber_Add(PyList_GET_ITEM(entry, i), delta);
  Py_DECREF(delta);
  if (!sum) return -1;
  return PyList_SetItem(entry, i, sum);  // steals sum
}

inline int set_since(PyObject* watch, double value) {
  if (watch == Py_None) return 0;
  PyObject* v = value == 0.0 ? (Py_INCREF(g_zero_float), g_zero_float) : PyFloat_FromDouble(value);
  if (!v) return -1;
  int rc = PyObject_SetAttr(watch, s_since, v);
  Py_DECREF(v);
  return rc;
}

// Start the collective of `b` on the call's memory (its own buffers, or the staging copies of a persistent one).
int start_call(Bound* b, char* a, char* in, bool in_place, MPI_Request* request) {
  if (b->request != MPI_REQUEST_NULL) {
    *request = b->request;
    return MPI_Start(request);
  }
  switch (b->kind) {
    case ALL_REDUCE:
      return MPI_Iallreduce(MPI_IN_PLACE, a, b->count, b->datatype, b->op, b->comm, request);
    case ALL_GATHER:
      return MPI_Iallgather(in_place ? MPI_IN_PLACE : in, b->count, MPI_BYTE, a, b->count, MPI_BYTE, b->comm,
                            request);
    case REDUCE_SCATTER:  // not _block: MPICH 5.0's non-blocking block form is 4-6x slower at 512 KiB-1 MiB
      return MPI_Ireduce_scatter(in, a, b->counts.data(), b->datatype, b->op, b->comm, request);
    default:
      return MPI_Ialltoall(in, b->count, MPI_BYTE, a, b->count, MPI_BYTE, b->comm, request);
  }
}

int blocking_call(Bound* b, char* a, char* in, bool in_place) {
  switch (b->kind) {
    case ALL_REDUCE:
      return MPI_Allreduce(MPI_IN_PLACE, a, b->count, b->datatype, b->op, b->comm);
    case ALL_GATHER:
      return MPI_Allgather(in_place ? MPI_IN_PLACE : in, b->count, MPI_BYTE, a, b->count, MPI_BYTE, b->comm);
    case REDUCE_SCATTER:
      return MPI_Reduce_scatter_block(in, a, b->count, b->datatype, b->op, b->comm);
    default:
      return MPI_Alltoall(in, b->count, MPI_BYTE, a, b->count, MPI_BYTE, b->comm);
  }
}

// The staging copies of a persistent collective: in before its start, out after its wait.
void copy_in(Bound* b, char* a, char* in, bool in_place) {
  switch (b->kind) {
    case ALL_REDUCE:
      memcpy(b->staged_in, a, (size_t)b->nbytes);
      break;
    case ALL_GATHER:
      memcpy(b->staged_in, in_place ? a + b->offset : in, (size_t)b->block);
      break;
    default:
      memcpy(b->staged_in, in, (size_t)b->nbytes);
  }
}

void copy_out(Bound* b, char* a) {
  switch (b->kind) {
    case ALL_REDUCE:
      memcpy(a, b->staged_in, (size_t)b->nbytes);
      break;
    case REDUCE_SCATTER:
      memcpy(a, b->staged_out, (size_t)b->block);
      break;
    default:
      memcpy(a, b->staged_out, (size_t)b->nbytes);
  }
}

inline void learn(Bound* b, double seconds) {
  double t = b->typical;
  b->typical = (t < 0 || seconds < t) ? seconds : (seconds < t * TYPICAL_RISE ? seconds : t * TYPICAL_RISE);
}

inline double spin_of(Bound* b) {
  if (b->typical < 0) return b->spin_s;
  double want = SPIN_FACTOR * b->typical, floor = b->spin_s;
  double spin = want > floor ? want : floor;
  double cap = MAX_SPIN_S > floor ? MAX_SPIN_S : floor;
  return spin < cap ? spin : cap;
}

// Raise what on_error(code, sequence) returns.
PyObject* raise_from(PyObject* handler, PyObject* args) {
  PyObject* exc = PyObject_CallObject(handler, args);
  Py_DECREF(args);
  if (!exc) return nullptr;
  if (exc == Py_None) {
    Py_DECREF(exc);
    Py_RETURN_NONE;
  }
  PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return nullptr;
}

// Run one numbered call of `b`; None, or nullptr with the error set.
// `rec`: the call's slot in the flight recorder's ring (nullptr: off), given its times here.
PyObject* run(Bound* b, long long sequence, char* a, char* in, bool in_place, Rec* rec) {
  double start = now_s();
  if (rec) rec->started = start;
  int rc;
  bool persistent = b->request != MPI_REQUEST_NULL;
  if (persistent) copy_in(b, a, in, in_place);
  if (!b->polled) {
    if (set_since(b->watch, start) < 0) return nullptr;
    if (persistent) {
      MPI_Request request = b->request;
      rc = MPI_Start(&request);  // a persistent collective's start never blocks: only its wait is watched
      if (rc == MPI_SUCCESS) {
        Py_BEGIN_ALLOW_THREADS rc = MPI_Wait(&request, MPI_STATUS_IGNORE);
        Py_END_ALLOW_THREADS
      }
    } else {
      Py_BEGIN_ALLOW_THREADS rc = blocking_call(b, a, in, in_place);
      Py_END_ALLOW_THREADS
    }
    if (set_since(b->watch, 0.0) < 0) return nullptr;
    if (rc != MPI_SUCCESS) return raise_from(b->on_error, Py_BuildValue("(iL)", rc, sequence));
  } else {
    MPI_Request request;
    rc = start_call(b, a, in, in_place, &request);
    if (rc != MPI_SUCCESS) return raise_from(b->on_error, Py_BuildValue("(iL)", rc, sequence));
    int done = 0;
    double spin = spin_of(b), began = start;
    Py_BEGIN_ALLOW_THREADS rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    while (rc == MPI_SUCCESS && !done) {
      for (int i = 0; i < POLLS_PER_CHECK && rc == MPI_SUCCESS && !done; ++i) {
        sched_yield();
        rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      }
      if (!done && now_s() - began >= spin) break;
    }
    Py_END_ALLOW_THREADS
    if (rc != MPI_SUCCESS) return raise_from(b->on_error, Py_BuildValue("(iL)", rc, sequence));
    if (!done) {  // a late peer: Python's wait naps, watches the deadline and the failure notices
      PyObject* res = raise_from(b->on_slow, Py_BuildValue("(KLd)", (unsigned long long)(long long)request,
                                                          sequence, now_s() - began));
      if (!res) return nullptr;
      Py_DECREF(res);
    }
    learn(b, now_s() - began);
  }
  if (persistent) copy_out(b, a);
  double end = now_s();
  if (rec) rec->completed = end;
  double seconds = end - start;
  PyObject* entry = b->entry;
  if (bump(entry, 0, PyLong_FromLong(1)) < 0 || bump(entry, 1, PyLong_FromLongLong(b->nbytes)) < 0 ||
      bump(entry, 2, PyFloat_FromDouble(seconds)) < 0)
    return nullptr;
  Py_RETURN_NONE;
}

// The keyword arguments a hot call may carry: comm=, and algorithm=None, compression=None, async_op=False, op=.
// Returns false when any other keyword or value is given (the Python implementation takes the call).
bool keywords(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** comm, PyObject** op,
              bool takes_op, bool takes_splits) {
  if (!kwnames) return true;
  Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    PyObject* value = args[nargs + i];
    if (name == s_comm) {
      *comm = value;
    } else if (name == s_op && takes_op) {
      if (*op) return false;
      *op = value;
    } else if (name == s_async_op) {
      if (value != Py_False) return false;
    } else if (name == s_algorithm || name == s_compression ||
               (takes_splits && (name == s_output_split_sizes || name == s_input_split_sizes))) {
      if (value != Py_None) return false;
    } else {
      return false;  // not interned as expected, or not ours: let Python parse it
    }
  }
  return true;
}

PyObject* fall_back(Entry* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

// The communicator of a call (comm= or the default) and its table; false when the Python path must take it.
bool table_of(PyObject* comm, Table** table) {
  if (comm == nullptr || comm == Py_None) {
    comm = PyDict_GetItemWithError(g_default_holder, g_default_name);  // borrowed
    if (!comm || comm == Py_None) {
      PyErr_Clear();
      return false;
    }
  }
  PyObject* hot = PyObject_GetAttr(comm, s_hot);
  if (!hot) {
    PyErr_Clear();
    return false;
  }
  bool ok = Py_TYPE(hot) == &TableType;
  Py_DECREF(hot);  // the communicator holds it
  *table = (Table*)hot;
  return ok;
}

// Number the call on `comm` as BoundCall.__call__ does; -1 where the Python path must take it (a broken
// communicator, async calls still queued) or on error.
long long number_call(PyObject* comm) {
  PyObject* broken = PyObject_GetAttr(comm, s_broken);
  if (!broken) return -1;
  Py_DECREF(broken);
  if (broken != Py_None) return -1;
  PyObject* executor = PyObject_GetAttr(comm, s_executor);
  if (!executor) return -1;
  PyObject* last = PyObject_GetAttr(executor, s_last);
  Py_DECREF(executor);
  if (!last) return -1;
  Py_DECREF(last);
  if (last != Py_None) return -1;
  PyObject* seq = PyObject_GetAttr(comm, s_sequence);
  if (!seq) return -1;
  long long sequence = PyLong_AsLongLong(seq) + 1;
  Py_DECREF(seq);
  if (sequence == 0 && PyErr_Occurred()) return -1;
  PyObject* next = PyLong_FromLongLong(sequence);
  if (!next) return -1;
  int rc = PyObject_SetAttr(comm, s_sequence, next);
  Py_DECREF(next);
  return rc < 0 ? -1 : sequence;
}

// The bound shape of a call and the memory it runs on; false when the Python path must take it.
bool recognise(Entry* self, PyObject* const* args, Table* table, Py_ssize_t tensors, int64_t mpi_op, Bound** bound,
               char** a_out, char** in_out, bool* in_place_out) {
  int kind = self->kind;
  const at::Tensor* x = host_tensor(args[0]);
  const at::Tensor* y = tensors == 2 ? host_tensor(args[1]) : nullptr;
  if (!x || (tensors == 2 && !y)) return false;
  int dtype = (int)x->scalar_type();
  if (y && (int)y->scalar_type() != dtype) return false;
  Key key;
  switch (kind) {
    case ALL_REDUCE:
      key = Key{kind, dtype, x->numel(), 0, mpi_op};
      break;
    case ALL_GATHER:
      key = Key{kind, dtype, x->numel(), y->numel(), 0};
      break;
    case REDUCE_SCATTER:
      key = Key{kind, dtype, y->numel(), x->numel(), mpi_op};
      break;
    default:
      // Equal blocks of whole rows: the same rows and elements on both sides, dim 0 split evenly.
      if (x->dim() == 0 || y->dim() == 0 || x->size(0) != y->size(0) || x->numel() != y->numel()) return false;
      key = Key{kind, dtype, y->numel(), 0, 0};
  }
  auto found = table->map->find(key);
  if (found == table->map->end()) return false;
  Bound* b = found->second;
  if (kind == ALL_TO_ALL && x->size(0) % b->world != 0) return false;
  char* a = (char*)x->data_ptr();
  char* in = y ? (char*)y->data_ptr() : nullptr;
  bool in_place = false;
  switch (kind) {
    case ALL_GATHER:
      if (b->block && in == a + b->offset) {
        in_place = true;
      } else if (!apart((uintptr_t)a, b->nbytes, (uintptr_t)in, b->block)) {
        return false;  // overlapping: the Python path says how
      }
      break;
    case REDUCE_SCATTER:
      if (!apart((uintptr_t)in, b->nbytes, (uintptr_t)a, b->block)) return false;
      break;
    case ALL_TO_ALL:
      if (!apart((uintptr_t)in, b->nbytes, (uintptr_t)a, b->nbytes)) return false;
      break;
  }
  *bound = b;
  *a_out = a;
  *in_out = in;
  *in_place_out = in_place;
  return true;
}

PyObject* Entry_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Entry* self = (Entry*)callable;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  int kind = self->kind;
  PyObject *comm = nullptr, *op = nullptr;
  // Positional forms: all_reduce(tensor[, op]), all_gather(out, in), reduce_scatter(out, in[, op]),
  // all_to_all_single(out, in[, None, None]).
  bool takes_op = kind == ALL_REDUCE || kind == REDUCE_SCATTER;
  Py_ssize_t tensors = kind == ALL_REDUCE ? 1 : 2;
  if (nargs < tensors) return fall_back(self, args, nargsf, kwnames);
  if (nargs > tensors) {
    if (takes_op && nargs == tensors + 1) {
      op = args[tensors];
    } else if (kind == ALL_TO_ALL && nargs <= 4) {
      for (Py_ssize_t i = 2; i < nargs; ++i)
        if (args[i] != Py_None) return fall_back(self, args, nargsf, kwnames);
    } else {
      return fall_back(self, args, nargsf, kwnames);
    }
  }
  if (!keywords(args, nargs, kwnames, &comm, &op, takes_op, kind == ALL_TO_ALL))
    return fall_back(self, args, nargsf, kwnames);
  int64_t mpi_op = takes_op ? op_handle(op) : 0;
  if (takes_op && mpi_op == 0) return fall_back(self, args, nargsf, kwnames);
  Table* table;
  if (!table_of(comm, &table)) return fall_back(self, args, nargsf, kwnames);
  if (table->map->empty()) return fall_back(self, args, nargsf, kwnames);

  Bound* b = nullptr;
  char *a = nullptr, *in = nullptr;
  bool in_place = false;
  // Tensor attributes that a subclass or an exotic layout may refuse with a C++ exception: any of those is the
  // Python path's to handle (it validates in full and says what is wrong).
  bool recognised;
  try {
    recognised = recognise(self, args, table, tensors, mpi_op, &b, &a, &in, &in_place);
  } catch (...) {
    recognised = false;
  }
  if (!recognised) return fall_back(self, args, nargsf, kwnames);
  PyObject* owner = comm && comm != Py_None ? comm : PyDict_GetItem(g_default_holder, g_default_name);
  long long sequence = number_call(owner);
  if (sequence < 0) {
    if (PyErr_Occurred()) return nullptr;
    return fall_back(self, args, nargsf, kwnames);
  }
  table->hits++;
  b->refs++;  // held while the GIL is released: a table cleared meanwhile (close()) frees it afterwards
  Rec* rec = nullptr;
  if (table->ring) {  // the flight recorder's slot, overwritten in place
    rec = &(*table->ring)[(size_t)sequence % table->ring->size()];
    rec->seq = sequence;
    rec->completed = 0.0;
    rec->started = 0.0;
    PyObject* old = rec->call;
    Py_INCREF(b->call);
    rec->call = b->call;
    Py_XDECREF(old);
  }
  PyObject* result;
  if (C10_UNLIKELY(profiled())) {  // inside the call's ranges, as the Python path's calls run
    Ranges ranges;
    trace(ranges, b, args[0], sequence);
    result = run(b, sequence, a, in, in_place, rec);
  } else {
    result = run(b, sequence, a, in, in_place, rec);
  }
  release(b);
  return result;
}

PyObject* Entry_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  int kind;
  PyObject* fallback;
  static const char* names[] = {"kind", "fallback", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "iO", (char**)names, &kind, &fallback)) return nullptr;
  if (kind < 0 || kind >= KINDS || !PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_ValueError, "Entry(kind, fallback): a known kind and a callable");
    return nullptr;
  }
  Entry* self = (Entry*)type->tp_alloc(type, 0);
  if (!self) return nullptr;
  self->kind = kind;
  Py_INCREF(fallback);
  self->fallback = fallback;
  self->vectorcall = Entry_vectorcall;
  return (PyObject*)self;
}

int Entry_traverse(Entry* self, visitproc visit, void* arg) {
  Py_VISIT(self->fallback);
  Py_VISIT(self->dict);
  return 0;
}

int Entry_clear(Entry* self) {
  Py_CLEAR(self->fallback);
  Py_CLEAR(self->dict);
  return 0;
}

void Entry_dealloc(Entry* self) {
  PyObject_GC_UnTrack(self);
  Entry_clear(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

PyGetSetDef Entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject EntryType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------------------------------------------- module

// setup(default_holder, default_name, ops, sum_handle): where the default communicator is, and the reduce op
// objects known by identity as (object, MPI op handle) pairs.
PyObject* setup(PyObject*, PyObject* args) {
  PyObject *holder, *name, *ops;
  unsigned long long sum;
  if (!PyArg_ParseTuple(args, "O!UOK", &PyDict_Type, &holder, &name, &ops, &sum)) return nullptr;
  PyObject* seq = PySequence_Fast(ops, "ops must be a sequence of (object, handle) pairs");
  if (!seq) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > MAX_OPS) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_ValueError, "too many ops");
    return nullptr;
  }
  for (int i = 0; i < g_ops; ++i) Py_DECREF(g_op_objects[i]);
  g_ops = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* obj;
    unsigned long long handle;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OK", &obj, &handle)) {
      Py_DECREF(seq);
      return nullptr;
    }
    Py_INCREF(obj);
    g_op_objects[g_ops] = obj;
    g_op_handles[g_ops++] = (int64_t)handle;
  }
  Py_DECREF(seq);
  Py_INCREF(holder);
  Py_XSETREF(g_default_holder, holder);
  Py_INCREF(name);
  PyUnicode_InternInPlace(&name);
  Py_XSETREF(g_default_name, name);
  g_sum = (int64_t)sum;
  Py_RETURN_NONE;
}

// The handle sizes this file was built for, against mpi4py's own (the loader refuses a mismatch).
PyObject* abi(PyObject*, PyObject*) {
  return Py_BuildValue("{s:i,s:i,s:i,s:i,s:s}", "comm", (int)sizeof(MPI_Comm), "request", (int)sizeof(MPI_Request),
                       "datatype", (int)sizeof(MPI_Datatype), "op", (int)sizeof(MPI_Op), "library", MPICH_VERSION);
}

PyMethodDef module_methods[] = {
    {"setup", setup, METH_VARARGS, "Where the default communicator lives, and the known reduce ops."},
    {"abi", abi, METH_NOARGS, "The MPI this extension was built against."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_hotpath", "pccl's compiled hot path (C++ over MPI).", -1,
                          module_methods};

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

// Ready one of the profiler's context-manager types (Range, ProfilerState).
int context_manager_type(PyTypeObject& type, const char* name, Py_ssize_t size, newfunc make, destructor free,
                         PyMethodDef* methods, const char* doc) {
  type.tp_name = name;
  type.tp_basicsize = size;
  type.tp_flags = Py_TPFLAGS_DEFAULT;
  type.tp_doc = doc;
  type.tp_new = make;
  type.tp_dealloc = free;
  type.tp_methods = methods;
  return PyType_Ready(&type);
}

}  // namespace

PyMODINIT_FUNC PyInit__hotpath(void) {
  TableType.tp_name = "pccl_torch.hotpath._hotpath.Table";
  TableType.tp_basicsize = sizeof(Table);
  TableType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  TableType.tp_doc = "The bound call shapes of one communicator that the hot path runs.";
  TableType.tp_new = Table_new;
  TableType.tp_dealloc = (destructor)Table_dealloc;
  TableType.tp_traverse = (traverseproc)Table_traverse;
  TableType.tp_clear = (inquiry)Table_clear_all;
  TableType.tp_methods = Table_methods;
  TableType.tp_as_sequence = &Table_as_sequence;
  TableType.tp_getset = Table_getset;
  if (PyType_Ready(&TableType) < 0) return nullptr;

  EntryType.tp_name = "pccl_torch.hotpath._hotpath.Entry";
  EntryType.tp_basicsize = sizeof(Entry);
  EntryType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  EntryType.tp_doc = "A public collective: the hot path for bound shapes, else its Python implementation.";
  EntryType.tp_new = Entry_new;
  EntryType.tp_dealloc = (destructor)Entry_dealloc;
  EntryType.tp_traverse = (traverseproc)Entry_traverse;
  EntryType.tp_clear = (inquiry)Entry_clear;
  EntryType.tp_call = PyVectorcall_Call;
  EntryType.tp_vectorcall_offset = offsetof(Entry, vectorcall);
  EntryType.tp_dictoffset = offsetof(Entry, dict);
  EntryType.tp_getset = Entry_getset;
  if (PyType_Ready(&EntryType) < 0) return nullptr;

  if (context_manager_type(RangeType, "pccl_torch.hotpath._hotpath.Range", sizeof(Range), (newfunc)Range_new,
                           (destructor)Range_dealloc, Range_methods,
                           "A call's profiler ranges (record_param_comms, pccl:<collective>), open while entered.") ||
      context_manager_type(ProfilerStateType, "pccl_torch.hotpath._hotpath.ProfilerState", sizeof(ProfilerState),
                           (newfunc)ProfilerState_new, (destructor)ProfilerState_dealloc, ProfilerState_methods,
                           "The creating thread's profiler, applied to the thread that enters it."))
    return nullptr;

  const struct {
    PyObject** slot;
    const char* text;
  } names[] = {{&s_hot, "hot"}, {&s_broken, "broken"}, {&s_sequence, "sequence"}, {&s_executor, "executor"},
               {&s_last, "_last"}, {&s_since, "since"}, {&s_comm, "comm"}, {&s_algorithm, "algorithm"},
               {&s_compression, "compression"}, {&s_async_op, "async_op"}, {&s_op, "op"},
               {&s_output_split_sizes, "output_split_sizes"}, {&s_input_split_sizes, "input_split_sizes"}};
  for (const auto& name : names)
    if (!(*name.slot = intern(name.text))) return nullptr;
  g_zero_float = PyFloat_FromDouble(0.0);
  if (!(s_profiler_enabled = intern("_is_profiler_enabled"))) return nullptr;
  if (PyObject* profiler = PyImport_ImportModule("torch.autograd.profiler")) {
    g_profiler_flags = PyModule_GetDict(profiler);  // borrowed from the module, which stays imported (held here)
    Py_INCREF(g_profiler_flags);
    Py_DECREF(profiler);
  } else {
    PyErr_Clear();  // no torch profiler: the hot path records nothing
  }

  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&TableType);
  PyModule_AddObject(m, "Table", (PyObject*)&TableType);
  Py_INCREF(&EntryType);
  PyModule_AddObject(m, "Entry", (PyObject*)&EntryType);
  Py_INCREF(&RangeType);
  PyModule_AddObject(m, "Range", (PyObject*)&RangeType);
  Py_INCREF(&ProfilerStateType);
  PyModule_AddObject(m, "ProfilerState", (PyObject*)&ProfilerStateType);
  return m;
}
