//! Budgets and the accounting of model calls: what the run and each loop may spend (money,
//! tokens, iterations, wall time), what they spent, and what their calls in flight may still
//! cost.
//!
//! Each model call first *reserves* its worst case — its input tokens estimated from the
//! request's bytes at the dearest input rate, plus the most output tokens a call may return
//! — in the ledger of the loop it is charged to and in the run's, and is sent only if the
//! reservation fits every limit; when the reply comes the reservation is *settled* to the
//! real usage. So a budget is passed only by what calls in flight spent beyond their
//! reservation (an input estimate short of the real count), and loops running in parallel
//! can overshoot the run's budget by at most the calls in flight when it was reached. A
//! call cut off (a stop, a timeout) never reports its usage: its reservation is released.
//!
//! Past the soft threshold (80% by default) the model is shown what is left, in a notice
//! added after the stable part of its prompt ([`Account::notice`]); at a hard limit the
//! call is not made and the loop is paused ([`Account::reserve`] and
//! [`Account::start_iteration`] say why).
//!
//! An answer to another loop's question is charged to the loop that asked: the answerer
//! makes the call with the asker's [`Account`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use td_base::sync::lock;
use td_llm::prices::Price;
use td_llm::{Block, LlmRequest, Usage};
use td_protocol::spend::{Spend, usd};

/// Bytes of a request counted as one input token when a call's worst case is reserved.
/// Tokenizers average about four bytes per token on English text, code and JSON; three
/// leaves a margin.
pub const BYTES_PER_TOKEN_ESTIMATE: u64 = 3;

/// The soft threshold when none is configured: the model sees what is left past 80%.
pub const DEFAULT_SOFT_PERCENT: u8 = 80;

/// What one scope (the run, or one loop) may spend; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Money, in nano-dollars.
    pub nano_usd: Option<u64>,
    /// Tokens of every kind.
    pub tokens: Option<u64>,
    /// Iterations started.
    pub iterations: Option<u64>,
    /// Wall time.
    pub wall: Option<Duration>,
    /// Percent of a limit past which the model is shown what is left.
    pub soft_percent: u8,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            nano_usd: None,
            tokens: None,
            iterations: None,
            wall: None,
            soft_percent: DEFAULT_SOFT_PERCENT,
        }
    }
}

impl Limits {
    /// Whether money or tokens are limited (so that calls need a reservation).
    fn limits_calls(&self) -> bool {
        self.nano_usd.is_some() || self.tokens.is_some()
    }
}

/// How calls are priced: the model's price (`None`: unknown) and the most output tokens one
/// call may return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pricing {
    /// The model's name, for messages.
    pub model: String,
    /// Its price, if known.
    pub price: Option<Price>,
    /// The output limit of one call.
    pub max_output_tokens: u64,
}

impl Default for Pricing {
    fn default() -> Self {
        Pricing {
            model: String::new(),
            price: None,
            max_output_tokens: 4096,
        }
    }
}

/// What a ledger held before this process (a resumed run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    /// What was spent.
    pub spend: Spend,
    /// Iterations started.
    pub iterations: u64,
    /// Wall time already counted.
    pub wall: Duration,
}

#[derive(Debug, Default)]
struct LedgerState {
    spent: Spend,
    reserved_nano: u64,
    reserved_tokens: u64,
    iterations: u64,
}

/// What one scope spent and holds in reservation, against its limits.
#[derive(Debug)]
pub struct Ledger {
    /// "the run" or "loop `name`", for messages.
    scope: String,
    /// Which `budget:` section to raise, for messages.
    where_set: &'static str,
    limits: Limits,
    wall_before: Duration,
    counting_since: Instant,
    state: Mutex<LedgerState>,
}

/// The worst case of one call: nano-dollars and tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Worst {
    nano_usd: u64,
    tokens: u64,
}

impl Ledger {
    fn new(scope: String, where_set: &'static str, limits: Limits, carried: Carried) -> Self {
        Ledger {
            scope,
            where_set,
            limits,
            wall_before: carried.wall,
            counting_since: Instant::now(),
            state: Mutex::new(LedgerState {
                spent: carried.spend,
                iterations: carried.iterations,
                ..LedgerState::default()
            }),
        }
    }

    /// What was spent so far (settled calls only).
    pub fn spent(&self) -> Spend {
        lock(&self.state).spent
    }

    fn wall(&self) -> Duration {
        self.wall_before
            .saturating_add(self.counting_since.elapsed())
    }

    fn over_wall(&self) -> Option<String> {
        let limit = self.limits.wall?;
        let used = self.wall();
        (used >= limit).then(|| {
            format!(
                "{} reached its wall-time budget ({} s of {} s)",
                self.scope,
                used.as_secs(),
                limit.as_secs()
            )
        })
    }

    /// Counts an iteration if one more fits.
    fn start_iteration(&self) -> Result<(), String> {
        if let Some(why) = self.over_wall() {
            return Err(self.hard(why, "wall-seconds"));
        }
        let mut state = lock(&self.state);
        if let Some(limit) = self.limits.iterations
            && state.iterations >= limit
        {
            let why = format!("{} has used its {limit} budgeted iteration(s)", self.scope);
            return Err(self.hard(why, "iterations"));
        }
        state.iterations = state.iterations.saturating_add(1);
        Ok(())
    }

    /// Holds `worst` if it fits what is left with what is in flight; else says which limit
    /// it would pass. Checked and held under one lock, so that two calls never both take
    /// the last of a budget.
    fn try_hold(&self, worst: Worst) -> Result<(), String> {
        let mut state = lock(&self.state);
        if let Some(limit) = self.limits.nano_usd {
            let committed = state
                .spent
                .cost_nano_usd
                .saturating_add(state.reserved_nano);
            if committed.saturating_add(worst.nano_usd) > limit {
                let why = format!(
                    "{} has spent {} of its {} money budget{}, and the next model call could \
                     cost up to {}",
                    self.scope,
                    usd(state.spent.cost_nano_usd),
                    usd(limit),
                    in_flight(state.reserved_nano, usd),
                    usd(worst.nano_usd)
                );
                return Err(self.hard(why, "usd"));
            }
        }
        if let Some(limit) = self.limits.tokens {
            let committed = state.spent.tokens().saturating_add(state.reserved_tokens);
            if committed.saturating_add(worst.tokens) > limit {
                let why = format!(
                    "{} has used {} of its {limit} budgeted tokens{}, and the next model call \
                     could use up to {}",
                    self.scope,
                    state.spent.tokens(),
                    in_flight(state.reserved_tokens, |t| format!("{t} tokens")),
                    worst.tokens
                );
                return Err(self.hard(why, "tokens"));
            }
        }
        state.reserved_nano = state.reserved_nano.saturating_add(worst.nano_usd);
        state.reserved_tokens = state.reserved_tokens.saturating_add(worst.tokens);
        Ok(())
    }

    fn hard(&self, why: String, key: &str) -> String {
        format!(
            "budget: {why}. The loop is paused with its work kept: raise `{key}` under \
             `budget:` {} in taskdaemon.yml, then continue the run with `taskdaemon run \
             --resume`",
            self.where_set
        )
    }

    fn release(&self, worst: Worst, spent: Option<&Spend>) {
        let mut state = lock(&self.state);
        state.reserved_nano = state.reserved_nano.saturating_sub(worst.nano_usd);
        state.reserved_tokens = state.reserved_tokens.saturating_sub(worst.tokens);
        if let Some(spent) = spent {
            state.spent.add(spent);
        }
    }

    /// The notice past the soft threshold of one limit, if any limit is past it.
    fn notice(&self) -> Option<String> {
        let state = lock(&self.state);
        let soft = u128::from(self.limits.soft_percent);
        let past = |used: u64, limit: u64| u128::from(used) * 100 >= u128::from(limit) * soft;
        let percent = |used: u64, limit: u64| {
            (u128::from(used) * 100)
                .checked_div(u128::from(limit))
                .unwrap_or(100)
        };
        let mut parts = Vec::new();
        if let Some(limit) = self.limits.nano_usd {
            let used = state.spent.cost_nano_usd;
            if past(used, limit) {
                parts.push(format!(
                    "{}% of its money ({} of {}, {} left)",
                    percent(used, limit),
                    usd(used),
                    usd(limit),
                    usd(limit.saturating_sub(used))
                ));
            }
        }
        if let Some(limit) = self.limits.tokens {
            let used = state.spent.tokens();
            if past(used, limit) {
                parts.push(format!(
                    "{}% of its tokens ({used} of {limit}, {} left)",
                    percent(used, limit),
                    limit.saturating_sub(used)
                ));
            }
        }
        if let Some(limit) = self.limits.iterations {
            let used = state.iterations;
            if past(used, limit) {
                parts.push(format!(
                    "iteration {used} of {limit} budgeted ({} more after this one)",
                    limit.saturating_sub(used)
                ));
            }
        }
        if let Some(limit) = self.limits.wall {
            let used = self.wall().as_secs();
            let limit = limit.as_secs();
            if past(used, limit) {
                parts.push(format!(
                    "{}% of its wall time ({used} s of {limit} s, {} s left)",
                    percent(used, limit),
                    limit.saturating_sub(used)
                ));
            }
        }
        (!parts.is_empty()).then(|| format!("{} has used {}", self.scope, parts.join("; ")))
    }
}

fn in_flight(reserved: u64, show: impl Fn(u64) -> String) -> String {
    if reserved == 0 {
        String::new()
    } else {
        format!(" (and holds {} for calls in flight)", show(reserved))
    }
}

/// The budgets of a run: the run's ledger, one per loop, and how calls are priced.
#[derive(Debug)]
pub struct Budgets {
    run: Arc<Ledger>,
    pricing: Pricing,
    loops: Mutex<HashMap<String, Arc<Ledger>>>,
}

impl Budgets {
    /// No limit anywhere, no price (tests, tools outside a run).
    pub fn unlimited() -> Arc<Budgets> {
        Budgets::new(Limits::default(), Pricing::default(), Carried::default())
    }

    /// The run's budget `limits`, calls priced by `pricing`, with what the run `carried`
    /// from before (a resumed run: its spend, iterations and the time since it started).
    pub fn new(limits: Limits, pricing: Pricing, carried: Carried) -> Arc<Budgets> {
        Arc::new(Budgets {
            run: Arc::new(Ledger::new(
                "the run".into(),
                "at the top level",
                limits,
                carried,
            )),
            pricing,
            loops: Mutex::new(HashMap::new()),
        })
    }

    /// Opens the ledger of loop `name` with its `limits` and what it `carried` (a resumed
    /// loop), replacing any earlier one of that name.
    pub fn open_loop(&self, name: &str, limits: Limits, carried: Carried) {
        let ledger = Arc::new(Ledger::new(
            format!("loop `{name}`"),
            "of the loop (or of its loop type)",
            limits,
            carried,
        ));
        lock(&self.loops).insert(name.to_string(), ledger);
    }

    /// The account calls made for loop `name` are charged to (its ledger and the run's; the
    /// run's alone for a loop with no ledger).
    pub fn account(self: &Arc<Self>, name: &str) -> Account {
        Account {
            budgets: self.clone(),
            own: lock(&self.loops).get(name).cloned(),
        }
    }

    /// What the whole run spent so far.
    pub fn run_spent(&self) -> Spend {
        self.run.spent()
    }

    /// How calls are priced.
    pub fn pricing(&self) -> &Pricing {
        &self.pricing
    }
}

/// Where one loop's calls are charged: its own ledger and the run's.
#[derive(Debug, Clone)]
pub struct Account {
    budgets: Arc<Budgets>,
    own: Option<Arc<Ledger>>,
}

impl Account {
    fn ledgers(&self) -> impl Iterator<Item = &Arc<Ledger>> {
        self.own.iter().chain(std::iter::once(&self.budgets.run))
    }

    /// Counts a new iteration, or says which limit (iterations, wall time) stops it.
    pub fn start_iteration(&self) -> Result<(), String> {
        let mut counted: Vec<&Arc<Ledger>> = Vec::new();
        for ledger in self.ledgers() {
            if let Err(why) = ledger.start_iteration() {
                for l in counted {
                    let mut state = lock(&l.state);
                    state.iterations = state.iterations.saturating_sub(1);
                }
                return Err(why);
            }
            counted.push(ledger);
        }
        Ok(())
    }

    /// Reserves the worst case of sending `request`, or says which limit it would pass.
    pub fn reserve(&self, request: &LlmRequest) -> Result<Hold, String> {
        for ledger in self.ledgers() {
            if let Some(why) = ledger.over_wall() {
                return Err(ledger.hard(why, "wall-seconds"));
            }
        }
        let worst = if self.ledgers().any(|l| l.limits.limits_calls()) {
            worst_case(request, &self.budgets.pricing)
        } else {
            Worst::default()
        };
        // Held in each ledger in turn: the loop's own first, then the run's. A call the
        // run's refuses releases what it held in the loop's.
        if let Some(own) = &self.own {
            own.try_hold(worst)?;
        }
        if let Err(why) = self.budgets.run.try_hold(worst) {
            if let Some(own) = &self.own {
                own.release(worst, None);
            }
            return Err(why);
        }
        Ok(Hold {
            account: self.clone(),
            worst,
            price: self.budgets.pricing.price,
            settled: false,
        })
    }

    /// What the model should know of its budgets at this turn, once a limit is past its
    /// soft threshold: a line to add after the stable part of its prompt.
    pub fn notice(&self) -> Option<String> {
        let parts: Vec<String> = self.ledgers().filter_map(|l| l.notice()).collect();
        (!parts.is_empty()).then(|| {
            format!(
                "[budget: {}. The loop is paused when a limit is reached: do the most important \
                 remaining work first, and keep the worktree in a state another iteration can \
                 go on from.]",
                parts.join("; ")
            )
        })
    }
}

/// A call's reservation: settled with the call's real usage, or released when dropped.
#[derive(Debug)]
pub struct Hold {
    /// Where it is held: the loop's ledger and the run's.
    account: Account,
    worst: Worst,
    price: Option<Price>,
    settled: bool,
}

impl Hold {
    /// Replaces the reservation with what the call spent; returns that spend.
    pub fn settle(mut self, usage: &Usage) -> Spend {
        let mut spend = Spend::call(
            [
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
            ],
            // A cost past what a u64 holds is no price the record can keep: the most it can.
            self.price.map(|p| p.cost(usage).unwrap_or(u64::MAX)),
        );
        spend.estimated_calls = u64::from(usage.estimated);
        for ledger in self.account.ledgers() {
            ledger.release(self.worst, Some(&spend));
        }
        self.settled = true;
        spend
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.settled {
            for ledger in self.account.ledgers() {
                ledger.release(self.worst, None);
            }
        }
    }
}

/// The worst case of sending `request`: its input tokens estimated from its bytes, at the
/// dearest input rate, plus the output limit at the output rate.
fn worst_case(request: &LlmRequest, pricing: &Pricing) -> Worst {
    let input = request_bytes(request).div_ceil(BYTES_PER_TOKEN_ESTIMATE);
    let output = pricing.max_output_tokens;
    let nano_usd = pricing.price.map_or(0, |p| {
        input
            .saturating_mul(p.dearest_input())
            .saturating_add(output.saturating_mul(p.output))
    });
    Worst {
        nano_usd,
        tokens: input.saturating_add(output),
    }
}

/// The bytes a request sends: system prompt, every block of every message, every tool
/// definition, and a little for the framing of each.
fn request_bytes(request: &LlmRequest) -> u64 {
    const FRAMING: usize = 16;
    let json_len = |v: &serde_json::Value| {
        let mut counter = ByteCounter(0);
        // Writing to a counter cannot fail.
        let _ = serde_json::to_writer(&mut counter, v);
        counter.0
    };
    let mut bytes = request.system.len();
    for message in &request.messages {
        for block in &message.content {
            bytes = bytes.saturating_add(FRAMING).saturating_add(match block {
                Block::Text { text } => text.len(),
                Block::ToolUse { id, name, input } => id.len() + name.len() + json_len(input),
                Block::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } => tool_use_id.len() + content.len(),
            });
        }
    }
    for tool in request.tools.iter() {
        bytes = bytes
            .saturating_add(FRAMING)
            .saturating_add(tool.name.len())
            .saturating_add(tool.description.len())
            .saturating_add(json_len(&tool.input_schema));
    }
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use td_llm::{Message, Purpose};

    fn request(text: &str) -> LlmRequest {
        LlmRequest {
            loop_name: "a".into(),
            purpose: Purpose::Iteration,
            system: String::new(),
            messages: vec![Message::user_text(text)],
            tools: Vec::new().into(),
        }
    }

    /// $1 per input token and per output token (absurd, but easy to count).
    fn pricing() -> Pricing {
        let dollar = 1_000_000_000;
        Pricing {
            model: "m".into(),
            price: Some(Price {
                input: dollar,
                output: dollar,
                cache_read: dollar,
                cache_write: dollar,
            }),
            max_output_tokens: 10,
        }
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    #[test]
    fn a_call_is_sent_only_if_its_worst_case_fits_and_is_settled_to_its_real_cost() {
        let dollar = 1_000_000_000u64;
        let budgets = Budgets::new(
            Limits {
                nano_usd: Some(100 * dollar),
                ..Limits::default()
            },
            pricing(),
            Carried::default(),
        );
        // 14 bytes of text + 16 of framing: 10 input tokens, 10 output: $20 reserved.
        let r = request("fourteen bytes");
        let account = budgets.account("a");
        let holds: Vec<Hold> = (0..5).map(|_| account.reserve(&r).unwrap()).collect();
        // $100 held by five calls in flight: a sixth does not fit.
        let e = account.reserve(&r).unwrap_err();
        assert!(
            e.contains("the run has spent $0.0000 of its $100.0000"),
            "{e}"
        );
        assert!(e.contains("holds $100.0000 for calls in flight"), "{e}");
        assert!(e.contains("`usd` under `budget:` at the top level"), "{e}");
        let mut holds = holds.into_iter();
        let spend = holds.next().unwrap().settle(&usage(3, 2));
        assert_eq!(spend.cost_nano_usd, 5 * dollar);
        assert_eq!(spend.model_calls, 1);
        // $5 spent and $80 held: one more does not fit (5 + 80 + 20 > 100).
        assert!(account.reserve(&r).is_err());
        drop(holds.next());
        // Released, not charged: 5 + 60 + 20 fits.
        let again = account.reserve(&r).unwrap();
        drop(again);
        drop(holds);
        assert_eq!(budgets.run_spent().cost_nano_usd, 5 * dollar);
    }

    #[test]
    fn a_loop_budget_and_the_run_budget_both_hold_and_answers_charge_the_asker() {
        let budgets = Budgets::new(
            Limits {
                tokens: Some(1000),
                ..Limits::default()
            },
            pricing(),
            Carried::default(),
        );
        budgets.open_loop(
            "asker",
            Limits {
                tokens: Some(45),
                iterations: Some(1),
                ..Limits::default()
            },
            Carried::default(),
        );
        let asker = budgets.account("asker");
        asker.start_iteration().unwrap();
        let e = asker.start_iteration().unwrap_err();
        assert!(
            e.contains("loop `asker` has used its 1 budgeted iteration(s)"),
            "{e}"
        );
        assert!(e.contains("of the loop (or of its loop type)"), "{e}");
        // 20 tokens reserved per call; 45 allow two at once.
        let r = request("fourteen bytes");
        let a = asker.reserve(&r).unwrap();
        let b = asker.reserve(&r).unwrap();
        assert!(asker.reserve(&r).unwrap_err().contains("loop `asker`"));
        a.settle(&usage(10, 10));
        b.settle(&usage(10, 10));
        // 40 spent: 80% of 45 is 36, so the model is told.
        let notice = asker.notice().unwrap();
        assert!(
            notice.contains("loop `asker` has used 88% of its tokens (40 of 45, 5 left)"),
            "{notice}"
        );
        assert!(notice.contains("iteration 1 of 1 budgeted"), "{notice}");
        assert!(budgets.account("other").notice().is_none());
        assert_eq!(budgets.run_spent().tokens(), 40);
    }

    #[test]
    fn carried_spend_counts_and_a_raised_budget_lets_calls_go_on() {
        let dollar = 1_000_000_000u64;
        let carried = Carried {
            spend: Spend::call([90, 0, 0, 0], Some(90 * dollar)),
            iterations: 3,
            wall: Duration::ZERO,
        };
        let tight = Budgets::new(
            Limits {
                nano_usd: Some(100 * dollar),
                ..Limits::default()
            },
            pricing(),
            carried,
        );
        assert!(
            tight
                .account("a")
                .reserve(&request("fourteen bytes"))
                .is_err()
        );
        let raised = Budgets::new(
            Limits {
                nano_usd: Some(200 * dollar),
                ..Limits::default()
            },
            pricing(),
            carried,
        );
        let hold = raised
            .account("a")
            .reserve(&request("fourteen bytes"))
            .unwrap();
        hold.settle(&usage(1, 1));
        assert_eq!(raised.run_spent().cost_nano_usd, 92 * dollar);
    }

    #[test]
    fn a_wall_time_budget_stops_new_iterations_and_calls() {
        let budgets = Budgets::new(
            Limits {
                wall: Some(Duration::from_secs(60)),
                ..Limits::default()
            },
            Pricing::default(),
            Carried {
                wall: Duration::from_secs(61),
                ..Carried::default()
            },
        );
        let account = budgets.account("a");
        let e = account.start_iteration().unwrap_err();
        assert!(
            e.contains("the run reached its wall-time budget (61 s of 60 s)"),
            "{e}"
        );
        assert!(e.contains("`wall-seconds`"), "{e}");
        assert!(account.reserve(&request("x")).is_err());
    }

    #[test]
    fn without_a_price_calls_cost_nothing_known_and_reserve_no_money() {
        let budgets = Budgets::unlimited();
        let hold = budgets.account("a").reserve(&request("x")).unwrap();
        let spend = hold.settle(&usage(5, 5));
        assert_eq!(spend.unpriced_calls, 1);
        assert_eq!(spend.cost_text(), "unknown price");
    }
}
