#include "reducer.hpp"

#include <algorithm>
#include <cmath>

#include "records/progress.hpp"
#include "../trainer.hpp"

namespace coupledqk::train {

namespace {

/// The tensors' values in one flat buffer (and back): the messages of the collectives.
void pack(const std::vector<TensorView<float>>& views, std::vector<float>& flat) {
  std::size_t n = 0;
  for (const auto& v : views) n += static_cast<std::size_t>(v.size());
  flat.resize(n);
  std::size_t at = 0;
  for (const auto& v : views) {
    std::copy(v.data, v.data + v.size(), flat.begin() + static_cast<std::ptrdiff_t>(at));
    at += static_cast<std::size_t>(v.size());
  }
}
void unpack(const std::vector<float>& flat, const std::vector<TensorView<float>>& views) {
  std::size_t at = 0;
  for (const auto& v : views) {
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at), flat.begin() + static_cast<std::ptrdiff_t>(at + v.size()),
              v.data);
    at += static_cast<std::size_t>(v.size());
  }
}

}  // namespace

void broadcast_parameters(Communicator& comm, Model& model) {
  std::vector<float> flat;
  const auto params = model.parameters();
  pack(params, flat);
  comm.broadcast(flat.data(), flat.size() * sizeof(float));
  unpack(flat, params);
}

GradientReducer::GradientReducer(Communicator& comm, Backend& backend) : comm_(comm), backend_(backend) {
  if (comm.size() > 1 && !backend.collectives().empty()) {
    std::string id = comm.root() ? backend.new_collectives_id() : std::string();
    comm.broadcast(id);
    backend.join_collectives(id, comm.rank(), comm.size());
    nccl_ = true;
  }
}

std::string GradientReducer::description() const {
  if (comm_.size() == 1 || backend_.on_host()) return "";
  return nccl_ ? ", gradients all-reduced by " + backend_.collectives() + " between the GPUs"
               : std::string(", gradients all-reduced through MPI from host memory");
}

GradientReducer::Reduced GradientReducer::operator()(float loss) {
  const int ranks = comm_.size();
  if (ranks == 1) return {loss, interrupted()};
  const double t0 = now_seconds();
  if (nccl_) {
    backend_.average_gradients();
  } else {
    flat_.resize(static_cast<std::size_t>(backend_.gradient_count()));
    backend_.gradients_to_host(flat_.data());
    comm_.sum(flat_.data(), flat_.size(), 1.0 / ranks);
    backend_.gradients_from_host(flat_.data());
  }
  double small[2] = {static_cast<double>(loss), interrupted() ? 1.0 : 0.0};
  comm_.sum(small, 2);
  seconds_ += now_seconds() - t0;
  return {static_cast<float>(small[0] / ranks), small[1] > 0};
}

Perplexity evaluate_split(Communicator& comm, const BatchLoss& loss, const std::vector<std::int32_t>& stream,
                          Index seq, Index batch, Index local_batch, Index max_tokens) {
  const int ranks = comm.size();
  if (ranks == 1) return evaluate_stream(loss, stream, seq, batch, max_tokens);
  const PartialLoss part = evaluate_part(loss, stream, seq, local_batch, max_tokens, comm.rank(), ranks);
  double total = part.total;
  comm.sum(&total, 1);
  Perplexity p;
  p.tokens = part.all_tokens;
  p.loss = total / static_cast<double>(p.tokens);
  p.ppl = std::exp(p.loss);
  return p;
}

}  // namespace coupledqk::train
