/*
 * adg/reducer.hpp: the gradient reducer (adg/reducer.h) in C++, an annex
 * of adg.hpp, which includes it. Synchronous data parallelism inside one
 * process: a round's gradient is the sum of U work units that the
 * trainer defines (micro-batches, graphs); T participants (threads) take
 * units as they come, run a backward over each, and the reducer folds
 * each parameter's U gradients in a fixed tree over unit indices, as
 * they arrive, and applies the sum once. The promise (adg/reducer.h):
 * for a given data order, seed, batch, unit definition and BLAS build,
 * the weights are bitwise the same for every T >= 1, and, where the
 * ranks of a job fold their reducers' partial sums over the same tree
 * (reducer_options::total_units), every rank count R >= 1, whatever the
 * collective's algorithm, bucket or slice size.
 *
 *     adg::reducer_options<G> o;
 *     o.units = U;
 *     adg::reducer<G> red(T, params, [&](const adg::reduction<G> &r) {
 *             if (r.sum) sgd(r.param, *r.sum); }, o);
 *     // participant p's thread, every round:
 *     red.round(p, [&](std::size_t unit) {
 *             adg::backward(loss(unit), seed, red.hook(p)); });
 *
 * Errors: what a participant's round throws (a step's exception, say)
 * fails the round for every participant, and every participant's end
 * rethrows that exception, as thrown; an apply or add that throws does the
 * same. A round that failed applies nothing (but with apply_early). Where
 * no exception stands for the failure, end throws adg::error with the
 * round's reason ("adg_reducer_end_with: round 4 abandoned: participant
 * 2 failed with ADG_EVALUE (-12) at step 'mul' of node 17"); either way
 * failure(p) says on every participant who failed, with what code, and
 * where (adg_reducer_failure), round(p, f) handing the reducer the step
 * of an adg::error that f throws.
 */
#ifndef ADG_REDUCER_HPP
#define ADG_REDUCER_HPP

#include "../adg.hpp" /* beside this one, whatever the include path */

#include <functional>
#include <map>
#include <typeinfo>

namespace adg
{

/* What apply is told about one parameter (adg_reduction), typed. */
template <class G> struct reduction {
	std::size_t param;   /* its index in the reducer's parameters */
	std::uint64_t id;    /* its leaf's id */
	std::uint64_t round; /* rounds completed before this one */
	/* The U gradients folded in the unit tree; null when no unit had
	 * one. apply may read and write it, not keep it. */
	G *sum;
	/* A parameter in slices (reducer_options::slices): which slice of
	 * sum to apply, 0 to n_slices - 1. 0 of 1 otherwise. */
	std::size_t slice = 0, n_slices = 1;
	/* The units sum covers: all of them, or a partial sum of a rank's
	 * share (reducer_options::total_units). */
	std::size_t first_unit = 0, n_units = 0;
};

/* What a reducer may be given besides its apply
 * (adg_reducer_options). */
template <class G> struct reducer_options {
	/* Folds one gradient into the sum; empty: sum += value, where G has
	 * += (else the constructor throws ADG_EINVAL). */
	std::function<void(G &sum, const G &value)> add;
	/* Empty: every parameter whole. Else one count per parameter, 1 to
	 * ADG_REDUCER_MAX_SLICES: into how many slices its sum and update
	 * are cut, so that the threads waiting at the round's end fold and
	 * apply a large parameter's slices beside the one that brought its
	 * last gradient (reduce-scatter). Not for a G kept inline (a
	 * pointer-sized trivially copyable one, which cannot be changed in
	 * place): the constructor throws ADG_EINVAL. */
	std::vector<std::size_t> slices;
	/* For parameters in slices: folds slice `slice` of n_slices of value
	 * into the same slice of sum, touching nothing else of sum, as the
	 * slices of one parameter are folded on several threads at once.
	 * Required when a count above is over 1. */
	std::function<void(G &sum, const G &value, std::size_t slice,
			   std::size_t n_slices)>
		add_slice;
	/* Apply each parameter as soon as its sum is complete, overlapping
	 * the backward; a failed round may then have applied some. By
	 * default all or nothing, at the round's end
	 * (adg_reducer_options.apply_early). */
	bool apply_early = false;
	/* U, the units of every round, dealt by next_unit and round; 0: one
	 * per participant (adg_reducer_options.n_units). */
	std::size_t units = 0;
	/* A rank's share of a job of total_units units: this reducer's are
	 * first_unit to first_unit + units - 1, and apply sees their partial
	 * sums (adg_reducer_options.first_unit, total_units). 0: the
	 * whole round. */
	std::size_t first_unit = 0, total_units = 0;
};

/* Owns an adg_reducer whose gradients are G (the backward's T). Move-only;
 * it must outlive every round, and no participant may be inside one when
 * it goes (that is a bug: the destructor says so and terminates). */
template <class G> class reducer
{
public:
	/* T participants; params, the parameters' leaves (their order is
	 * reduction::param's); apply, a callable void(const reduction<G> &):
	 * the update, once per parameter (per slice, in slices) and round,
	 * on the thread that brought the parameter's last gradient (a
	 * slice: or on one waiting at the round's end), concurrently with
	 * other parameters' applies. add folds one gradient into the sum, a
	 * callable void(G &sum, const G &value); by default sum += value. */
	template <class Apply>
	reducer(std::size_t participants, const std::vector<node> &params,
		Apply apply);
	template <class Apply, class Add>
	reducer(std::size_t participants, const std::vector<node> &params,
		Apply apply, Add add);
	/* The same with options: units, slices, apply_early, add. Throws
	 * adg::error ADG_EINVAL when slices has not one count per parameter,
	 * a count is 0 or too large, a count over 1 has no add_slice, G
	 * is kept inline and a count is over 1, or add is empty and G has
	 * no +=. */
	template <class Apply>
	reducer(std::size_t participants, const std::vector<node> &params,
		Apply apply, reducer_options<G> options);
	/* An empty reducer, as a moved-from one is: every call on it but
	 * raw(), assignment and destruction throws adg::error ADG_EINVAL. */
	reducer() noexcept = default;
	reducer(reducer &&other) noexcept = default;
	reducer &operator=(reducer &&other) noexcept;
	reducer(const reducer &) = delete;
	reducer &operator=(const reducer &) = delete;
	~reducer();

	/* o with participant's parameter gradients going to the reducer
	 * (adg_reducer_hook): pass it to participant's backward. An
	 * on_ready of o's own still runs, first, and sees them. */
	backward_options hook(std::size_t participant,
			      backward_options o = {}) const;
	/* With units: deals participant the round's next unit, to which its
	 * hook and give go until unit_end; ADG_REDUCER_NO_UNIT when every
	 * unit is dealt (adg_reducer_next_unit). */
	std::size_t next_unit(std::size_t participant);
	/* Ends participant's unit: the parameters it gave nothing for count
	 * as none (adg_reducer_unit_end). */
	void unit_end(std::size_t participant);
	/* Hands participant's unit's gradient for param to the reducer, as
	 * the hook does (adg_reducer_give): for gradients made otherwise
	 * than by a hooked backward. */
	void give(std::size_t participant, const node &param, G gradient);
	/* Ends participant's round: its barrier (adg_reducer_end). Returns
	 * once every participant has ended the round and every parameter is
	 * applied. Throws the round's first exception, or adg::error, on
	 * every participant when the round failed. */
	void end(std::size_t participant);
	/* Ends participant's round as failed with what it threw: every
	 * participant's end rethrows the round's first exception. An
	 * adg::error from a backward hands its failure() (the step) to the
	 * reducer (adg_reducer_end_with). */
	void end(std::size_t participant, std::exception_ptr failed);
	/* The first failure of the last round participant ended (code 0,
	 * site ADG_REDUCER_FAILED_NOWHERE for a round applied whole, or
	 * before its first round): which participant failed, its code,
	 * where, and the step. participant's thread's to read, between its
	 * rounds. Throws adg::error ADG_EINVAL for no such participant. */
	adg_reducer_failure failure(std::size_t participant) const;
	/* Runs f, participant's forward and backward, then ends the round;
	 * what f throws fails the round for all and is rethrown. With units
	 * f takes the unit's index and runs once per unit dealt to
	 * participant (next_unit, f, unit_end, until none is left). */
	template <class F> void round(std::size_t participant, F &&f);
	/* Rounds completed (adg_reducer_rounds). */
	std::uint64_t rounds() const;
	/* nullptr for an empty reducer. */
	adg_reducer *raw() const noexcept;
	/* Whether it holds a reducer: not default-made, not moved from. */
	explicit operator bool() const noexcept
	{
		return state_ != nullptr;
	}

private:
	struct state;
	/* state_, or adg::error ADG_EINVAL naming what when empty. */
	state &live(const char *what) const;
	std::unique_ptr<state> state_;
};

/* -------------------------------------------------------- implementation */

template <class G> struct reducer<G>::state {
	std::function<void(const reduction<G> &)> apply;
	std::function<void(G &, const G &)> add;
	std::function<void(G &, const G &, std::size_t, std::size_t)> add_slice;
	adg_reducer *raw = nullptr;
	std::size_t n_participants = 0;
	/* Each participant's next round, written by its own thread only. */
	std::vector<std::uint64_t> next_round;
	/* Each participant's last round's first failure, written by its own
	 * thread only (adg_reducer_end_with). */
	std::vector<adg_reducer_failure> last_failure;
	std::mutex mutex; /* guards thrown */
	/* By round: its first exception, and how many participants have
	 * still to rethrow it (every one of a failed round does). */
	std::map<std::uint64_t, std::pair<std::exception_ptr, std::size_t>>
		thrown;

	void keep(std::uint64_t round, std::exception_ptr e) noexcept
	{
		try {
			std::lock_guard<std::mutex> lock(mutex);
			thrown.emplace(round, std::make_pair(std::move(e),
							     n_participants));
		} catch (...) {
			/* no memory: end throws adg::error */
		}
	}

	std::exception_ptr take(std::uint64_t round)
	{
		std::lock_guard<std::mutex> lock(mutex);
		auto it = thrown.find(round);
		if (it == thrown.end())
			return nullptr;
		std::exception_ptr e = it->second.first;
		if (--it->second.second == 0)
			thrown.erase(it);
		return e;
	}

	/* The round a callback runs in: the rounds completed so far, as no
	 * round completes while one of its callbacks runs. */
	std::uint64_t current_round() const noexcept
	{
		std::uint64_t rounds = 0;
		adg_reducer_rounds(raw, &rounds);
		return rounds;
	}

	static int add_c(void **sum, const void *value, void *ctx) noexcept
	{
		auto *self = static_cast<state *>(ctx);
		try {
			if constexpr (detail::is_inline_v<G>) {
				G s = detail::packing<G>::unpack(*sum);
				self->add(s, detail::packing<G>::unpack(value));
				*sum = detail::packing<G>::pack(s);
			} else {
				self->add(*static_cast<G *>(*sum),
					  *static_cast<const G *>(value));
			}
			return 0;
		} catch (...) {
			self->keep(self->current_round(),
				   std::current_exception());
			return detail::thrown_code();
		}
	}

	static int add_slice_c(void *sum, const void *value, std::size_t slice,
			       std::size_t n_slices, void *ctx) noexcept
	{
		auto *self = static_cast<state *>(ctx);
		try {
			/* Never inline: the constructor refused slices then. */
			self->add_slice(*static_cast<G *>(sum),
					*static_cast<const G *>(value), slice,
					n_slices);
			return 0;
		} catch (...) {
			self->keep(self->current_round(),
				   std::current_exception());
			return detail::thrown_code();
		}
	}

	static int apply_c(const adg_reduction *r, void *ctx) noexcept
	{
		auto *self = static_cast<state *>(ctx);
		try {
			std::optional<G> unpacked;
			G *sum = nullptr;
			if constexpr (detail::is_inline_v<G>) {
				if (r->sum != nullptr) {
					unpacked = detail::packing<G>::unpack(
						r->sum);
					sum = &*unpacked;
				}
			} else {
				sum = static_cast<G *>(r->sum);
			}
			self->apply(reduction<G>{r->param, r->id, r->round, sum,
						 r->slice, r->n_slices,
						 r->first_unit, r->n_units});
			return 0;
		} catch (...) {
			self->keep(r->round, std::current_exception());
			return detail::thrown_code();
		}
	}

	static void release_c(void *value, std::size_t, void *) noexcept
	{
		detail::packing<G>::drop(value);
	}

	/* Ends participant's round with result, from the backward that
	 * failed at step (nullptr: not said). */
	void finish(std::size_t participant, int result,
		    const adg_failure *step = nullptr)
	{
		std::uint64_t round = next_round[participant]++;
		auto given = detail::sized<adg_failure>();
		if (step != nullptr)
			given = *step;
		given.size = sizeof given;
		given.code = result;
		adg_reducer_failure &last = last_failure[participant];
		int rc = adg_reducer_end_with(raw, participant, &given, &last);
		if (rc == 0)
			return;
		/* Read before anything else can fail on this thread. */
		std::string reason = adg_errmsg();
		std::exception_ptr e = take(round);
		if (e)
			std::rethrow_exception(e);
		throw error(rc, "reducer::end", reason);
	}
};

template <class G>
template <class Apply>
reducer<G>::reducer(std::size_t participants, const std::vector<node> &params,
		    Apply apply)
    : reducer(participants, params, std::move(apply), reducer_options<G>{})
{
}

template <class G>
template <class Apply, class Add>
reducer<G>::reducer(std::size_t participants, const std::vector<node> &params,
		    Apply apply, Add add)
    : reducer(participants, params, std::move(apply),
	      reducer_options<G>{std::move(add), {}, {}, false, 0})
{
}

template <class G>
template <class Apply>
reducer<G>::reducer(std::size_t participants, const std::vector<node> &params,
		    Apply apply, reducer_options<G> options)
    : state_(std::make_unique<state>())
{
	if (!options.slices.empty() && options.slices.size() != params.size())
		throw error(
			ADG_EINVAL,
			"reducer: " + std::to_string(options.slices.size()) +
				" slice counts for " +
				std::to_string(params.size()) + " parameters");
	bool sliced = false;
	for (std::size_t n : options.slices)
		sliced = sliced || n > 1;
	if (sliced && detail::is_inline_v<G>)
		throw error(ADG_EINVAL, "reducer: slices of a gradient kept "
					"inline, which cannot change in place");
	state_->apply = std::move(apply);
	/* The default add is built only for a G with +=, so that a G
	 * without it (a pointer, say) compiles with an add of its own. */
	if (options.add)
		state_->add = std::move(options.add);
	else if constexpr (detail::has_plus_assign_v<G>)
		state_->add = [](G &sum, const G &value) { sum += value; };
	else
		throw error(ADG_EINVAL, "reducer: no add, and the gradient "
					"type has no +=");
	state_->add_slice = std::move(options.add_slice);
	state_->n_participants = participants;
	state_->next_round.assign(participants, 0);
	auto none = detail::sized<adg_reducer_failure>();
	none.participant = SIZE_MAX;
	none.unit = ADG_REDUCER_NO_UNIT;
	state_->last_failure.assign(participants, none);
	std::vector<std::uint64_t> ids;
	ids.reserve(params.size());
	for (const node &p : params)
		ids.push_back(p.id());
	auto o = detail::sized<adg_reducer_options>();
	o.n_participants = participants;
	o.param_ids = ids.data();
	o.n_params = ids.size();
	o.ops.add = &state::add_c;
	o.ops.apply = &state::apply_c;
	o.ops.release = &state::release_c;
	if (state_->add_slice)
		o.ops.add_slice = &state::add_slice_c;
	o.ops.ctx = state_.get();
	o.apply_early = options.apply_early;
	o.n_units = options.units;
	o.first_unit = options.first_unit;
	o.total_units = options.total_units;

	if (!options.slices.empty())
		o.param_slices = options.slices.data();
	check(adg_reducer_new(&o, &state_->raw), "adg_reducer_new");
}

template <class G> reducer<G> &reducer<G>::operator=(reducer &&other) noexcept
{
	if (this != &other) {
		reducer gone(std::move(*this));
		state_ = std::move(other.state_);
	}
	return *this;
}

template <class G> reducer<G>::~reducer()
{
	if (state_ == nullptr)
		return;
	if (adg_reducer_free(state_->raw) != 0) {
		std::fputs("adg::reducer destroyed inside a round: a "
			   "participant has not ended it\n",
			   stderr);
		std::terminate();
	}
}

template <class G>
typename reducer<G>::state &reducer<G>::live(const char *what) const
{
	if (state_ == nullptr)
		throw error(ADG_EINVAL,
			    std::string(what) +
				    ": an empty reducer (default-made or "
				    "moved from)");
	return *state_;
}

template <class G>
backward_options reducer<G>::hook(std::size_t participant,
				  backward_options o) const
{
	live("reducer::hook");
	if (participant >= state_->n_participants)
		throw error(ADG_EINVAL,
			    "reducer::hook: participant " +
				    std::to_string(participant) + " of " +
				    std::to_string(state_->n_participants));
	/* Runs after the backward's own hooks are set: adg_reducer_hook
	 * keeps the ready hook it finds, and calls it first. */
	adg_reducer *raw = state_->raw;
	o.extend_c_options([raw, participant](adg_backward_options &c,
					      const std::type_info &type) {
		if (type != typeid(G))
			throw error(ADG_EINVAL,
				    "backward: the reducer's gradient "
				    "type is not the backward's");
		check(adg_reducer_hook(raw, participant, &c),
		      "adg_reducer_hook");
	});
	return o;
}

template <class G> std::size_t reducer<G>::next_unit(std::size_t participant)
{
	std::size_t unit = ADG_REDUCER_NO_UNIT;
	check(adg_reducer_next_unit(live("reducer::next_unit").raw, participant,
				    &unit),
	      "adg_reducer_next_unit");
	return unit;
}

template <class G> void reducer<G>::unit_end(std::size_t participant)
{
	int rc = adg_reducer_unit_end(live("reducer::unit_end").raw,
				      participant, 0);
	/* An add or apply that fails here fails the round: end throws it. */
	if (rc == ADG_EINVAL || rc == ADG_ESTATE)
		check(rc, "adg_reducer_unit_end");
}

template <class G>
void reducer<G>::give(std::size_t participant, const node &param, G gradient)
{
	adg_reducer *raw = live("reducer::give").raw;
	void *value = detail::packing<G>::pack(std::move(gradient));
	int rc = adg_reducer_give(raw, participant, param.id(), value);
	if (rc == ADG_EINVAL || rc == ADG_ESTATE) {
		std::string reason = adg_errmsg(); /* before the drop */
		detail::packing<G>::drop(value);   /* not taken */
		throw error(rc, "adg_reducer_give", reason);
	}
	/* Taken: an add or apply that failed fails the round, which end
	 * throws. */
}

template <class G> void reducer<G>::end(std::size_t participant)
{
	if (participant >= live("reducer::end").n_participants)
		throw error(ADG_EINVAL, "reducer::end: no such participant");
	state_->finish(participant, 0);
}

template <class G>
void reducer<G>::end(std::size_t participant, std::exception_ptr failed)
{
	if (participant >= live("reducer::end").n_participants)
		throw error(ADG_EINVAL, "reducer::end: no such participant");
	int code = ADG_ETHREW;
	auto step = detail::sized<adg_failure>();
	if (failed) {
		try {
			std::rethrow_exception(failed);
		} catch (const error &e) {
			step = e.failure(); /* where its backward failed */
			code = detail::thrown_code();
		} catch (...) {
			code = detail::thrown_code();
		}
		state_->keep(state_->next_round[participant], failed);
	}
	state_->finish(participant, code, &step);
}

template <class G>
adg_reducer_failure reducer<G>::failure(std::size_t participant) const
{
	if (participant >= live("reducer::failure").n_participants)
		throw error(ADG_EINVAL,
			    "reducer::failure: no such participant");
	return state_->last_failure[participant];
}

template <class G>
template <class F>
void reducer<G>::round(std::size_t participant, F &&f)
{
	live("reducer::round"); /* before f runs */
	std::exception_ptr failed;
	try {
		if constexpr (std::is_invocable_v<F &, std::size_t>) {
			for (std::size_t unit = next_unit(participant);
			     unit != ADG_REDUCER_NO_UNIT;
			     unit = next_unit(participant)) {
				f(unit);
				unit_end(participant);
			}
		} else {
			f();
		}
	} catch (...) {
		failed = std::current_exception();
	}

	if (failed)
		end(participant, failed);
	else
		end(participant);
}

template <class G> std::uint64_t reducer<G>::rounds() const
{
	std::uint64_t n = 0;
	check(adg_reducer_rounds(live("reducer::rounds").raw, &n),
	      "adg_reducer_rounds");
	return n;
}

template <class G> adg_reducer *reducer<G>::raw() const noexcept
{
	return state_ != nullptr ? state_->raw : nullptr;
}

} // namespace adg

#endif /* ADG_REDUCER_HPP */
