// SPDX-License-Identifier: Apache-2.0
// TEMPORARY link stubs while the runtime is being written; removed when it lands.
#include "tutti/collectives.h"
#include "tutti/runtime.h"

namespace tutti {
namespace {
[[noreturn]] void todo() { throw Error(ErrorCode::Internal, "not implemented yet"); }
}  // namespace
void init() { todo(); }
void shutdown() {}
bool is_initialized() { return false; }
int rank() { todo(); }
int size() { todo(); }
int local_rank() { todo(); }
int local_size() { todo(); }
int cross_rank() { todo(); }
int cross_size() { todo(); }
bool is_homogeneous() { todo(); }
bool mpi_threads_supported() { todo(); }
bool cuda_built() { return false; }
bool nccl_built() { return false; }
void start_timeline(const std::string&, bool) { todo(); }
void stop_timeline() { todo(); }
const std::vector<int>& ProcessSet::ranks() const { todo(); }
bool ProcessSet::included() const { todo(); }
int ProcessSet::rank() const { todo(); }
int ProcessSet::size() const { todo(); }
ProcessSet add_process_set(std::vector<int>) { todo(); }
void remove_process_set(const ProcessSet&) { todo(); }
std::string_view to_string(ReduceOp) { todo(); }
Handle::Handle(std::shared_ptr<detail::OpState> state) : state_(std::move(state)) {}
bool Handle::poll() const { todo(); }
void Handle::wait() { todo(); }
const Tensor& Handle::output() const { todo(); }
const std::vector<Tensor>& Handle::outputs() const { todo(); }
const std::vector<std::int64_t>& Handle::received_splits() const { todo(); }
bool poll(const Handle&) { todo(); }
void synchronize(Handle&) { todo(); }
Handle allreduce_async(TensorView, std::string, ReduceOptions) { todo(); }
Handle allreduce_async(TensorView, TensorView, std::string, ReduceOptions) { todo(); }
Handle grouped_allreduce_async(std::vector<TensorView>, std::string, ReduceOptions) { todo(); }
Handle allgather_async(TensorView, std::string, ProcessSet) { todo(); }
Handle grouped_allgather_async(std::vector<TensorView>, std::string, ProcessSet) { todo(); }
Handle broadcast_async(TensorView, int, std::string, ProcessSet) { todo(); }
Handle alltoall_async(TensorView, std::vector<std::int64_t>, std::string, ProcessSet) { todo(); }
Handle reducescatter_async(TensorView, std::string, ReduceOptions) { todo(); }
Handle grouped_reducescatter_async(std::vector<TensorView>, std::string, ReduceOptions) { todo(); }
void allreduce(TensorView, std::string, ReduceOptions) { todo(); }
void grouped_allreduce(std::vector<TensorView>, std::string, ReduceOptions) { todo(); }
Tensor allgather(TensorView, std::string, ProcessSet) { todo(); }
void broadcast(TensorView, int, std::string, ProcessSet) { todo(); }
AlltoallResult alltoall(TensorView, std::vector<std::int64_t>, std::string, ProcessSet) { todo(); }
Tensor reducescatter(TensorView, std::string, ReduceOptions) { todo(); }
void barrier(ProcessSet) { todo(); }
int join(ProcessSet) { todo(); }
std::string broadcast_object(std::string_view, int, std::string, ProcessSet) { todo(); }
std::vector<std::string> allgather_object(std::string_view, std::string, ProcessSet) { todo(); }
}  // namespace tutti
