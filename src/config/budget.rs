//! `budget:` (for the run at the top level, for each loop of a type under `loop-types`, for
//! one loop under `loops`) and `prices:` (what a model's tokens cost, over the built-in
//! table of `td_llm::prices`).
//!
//! ```yaml
//! prices:
//!   my-local-model: {input: 0.5, output: 1.5, cache-read: 0.05, cache-write: 0.6}  # $ per million tokens
//! budget:                 # the whole run
//!   usd: 20               # money (needs a price for the model)
//!   tokens: 5000000       # tokens of every kind
//!   iterations: 200       # iterations of all loops together
//!   wall-seconds: 7200    # since the run started (a paused run's time counts too)
//!   soft-percent: 80      # past this share of a limit the model is told what is left
//! loop-types:
//!   code: {extends: code, budget: {usd: 2}}    # each loop of the type
//! loops:
//!   - {name: api, type: code, task: ..., budget: {usd: 5, iterations: 10}}  # key by key over its type's
//! ```
//!
//! A loop's wall time is the time its iterations took. Each model call reserves its worst
//! case before it is sent (see `td_engine::budget`), which needs the model's output limit:
//! `llm.max-tokens`, or the provider's default (Anthropic 4096; the scripted provider
//! [`SCRIPTED_MAX_OUTPUT_TOKENS`]); an OpenAI-compatible server has no default we know, so a
//! money or token budget there needs `max-tokens`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::Problem;
use td_engine::budget::{DEFAULT_SOFT_PERCENT, Limits, Pricing};
use td_llm::config::{DEFAULT_ANTHROPIC_MAX_TOKENS, LlmConfig, ProviderKind};
use td_llm::prices::{Price, PriceConfig, PriceTable};

/// The output limit a scripted call is reserved for.
pub const SCRIPTED_MAX_OUTPUT_TOKENS: u64 = 1024;

/// The model name a scripted run is priced under (`prices: {scripted: ...}`).
pub const SCRIPTED_MODEL: &str = "scripted";

/// The most money a budget may name, in dollars.
pub const MAX_USD: f64 = 1_000_000_000.0;

/// A `budget:` section as written; every key optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BudgetDef {
    /// Money, in dollars.
    pub usd: Option<f64>,
    /// Tokens of every kind (input, output, cache reads and writes).
    pub tokens: Option<u64>,
    /// Iterations.
    pub iterations: Option<u64>,
    /// Wall time, in seconds.
    pub wall_seconds: Option<u64>,
    /// Percent of a limit past which the model is shown what is left (default 80).
    pub soft_percent: Option<u8>,
}

impl BudgetDef {
    /// `self`'s keys, and `base`'s where `self` has none.
    pub fn over(&self, base: &BudgetDef) -> BudgetDef {
        BudgetDef {
            usd: self.usd.or(base.usd),
            tokens: self.tokens.or(base.tokens),
            iterations: self.iterations.or(base.iterations),
            wall_seconds: self.wall_seconds.or(base.wall_seconds),
            soft_percent: self.soft_percent.or(base.soft_percent),
        }
    }

    /// Whether it limits money or tokens (so calls need a reservation).
    pub fn limits_calls(&self) -> bool {
        self.usd.is_some() || self.tokens.is_some()
    }

    /// The problems of its values, each at `at.<key>`.
    pub fn problems(&self, at: &str) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut problem = |key: &str, what: String| {
            problems.push(Problem::new(
                format!("{at}.{key}"),
                format!("{at}.{key}: {what}"),
            ));
        };
        if let Some(usd) = self.usd
            && !(usd.is_finite() && usd > 0.0 && usd <= MAX_USD)
        {
            problem(
                "usd",
                format!("{usd} is not an amount of dollars above 0 (at most {MAX_USD})"),
            );
        }
        for (key, value) in [
            ("tokens", self.tokens),
            ("iterations", self.iterations),
            ("wall-seconds", self.wall_seconds),
        ] {
            if value == Some(0) {
                problem(key, "must be at least 1 (leave it out for no limit)".into());
            }
        }
        if let Some(p) = self.soft_percent
            && !(1..=100).contains(&p)
        {
            problem(
                "soft-percent",
                format!("{p} is not a percentage from 1 to 100"),
            );
        }
        problems
    }

    /// The limits it sets (its values checked by [`BudgetDef::problems`] first).
    pub fn limits(&self) -> Limits {
        Limits {
            // Checked to be within MAX_USD: in nano-dollars far below u64::MAX.
            nano_usd: self.usd.map(|usd| (usd * 1e9).round() as u64),
            tokens: self.tokens,
            iterations: self.iterations,
            wall: self.wall_seconds.map(Duration::from_secs),
            soft_percent: self.soft_percent.unwrap_or(DEFAULT_SOFT_PERCENT),
        }
    }
}

/// The price table of a config: the built-in one with the `prices:` overrides, or the
/// problems of the overrides.
pub fn price_table(prices: &BTreeMap<String, PriceConfig>) -> Result<PriceTable, Vec<Problem>> {
    let mut overrides: BTreeMap<String, Price> = BTreeMap::new();
    let mut problems = Vec::new();
    for (model, price) in prices {
        match price.price() {
            Ok(p) => {
                overrides.insert(model.clone(), p);
            }
            Err(e) => problems.push(Problem::new(
                format!("prices.{model}"),
                format!("prices.{model}: {e}"),
            )),
        }
    }
    if problems.is_empty() {
        Ok(PriceTable::new(overrides))
    } else {
        Err(problems)
    }
}

/// The model a run's calls are priced under: the `llm.model`, or [`SCRIPTED_MODEL`].
pub fn model_name(llm: Option<&LlmConfig>) -> String {
    llm.and_then(|l| l.model.clone())
        .unwrap_or_else(|| SCRIPTED_MODEL.to_string())
}

/// The most output tokens one call may return, when it is known.
pub fn max_output_tokens(llm: Option<&LlmConfig>) -> Option<u64> {
    let llm = llm?;
    if let Some(n) = llm.max_tokens {
        return Some(u64::from(n));
    }
    match llm.provider {
        ProviderKind::Scripted => Some(SCRIPTED_MAX_OUTPUT_TOKENS),
        ProviderKind::Anthropic => Some(u64::from(DEFAULT_ANTHROPIC_MAX_TOKENS)),
        ProviderKind::Openai => None,
    }
}

/// How a run's calls are priced.
pub fn pricing(llm: Option<&LlmConfig>, table: &PriceTable) -> Pricing {
    let model = model_name(llm);
    Pricing {
        price: table.lookup(&model),
        model,
        // Without a known limit no reservation is needed: no money or token budget is
        // allowed then (see `needs`).
        max_output_tokens: max_output_tokens(llm).unwrap_or(0),
    }
}

/// What the budgets of a config need of its model, as problems: a price for a money
/// budget, a known output limit for a money or token budget. `budgets` are every budget of
/// the file with its YAML path.
pub fn needs(
    llm: Option<&LlmConfig>,
    table: &PriceTable,
    budgets: &[(String, BudgetDef)],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let model = model_name(llm);
    if let Some((at, _)) = budgets.iter().find(|(_, b)| b.usd.is_some())
        && table.lookup(&model).is_none()
    {
        problems.push(Problem::new(
            format!("{at}.usd"),
            format!(
                "{at}.usd: the model `{model}` has no price, so a money budget cannot be kept; \
                 add it under `prices:` (`prices: {{{model}: {{input: 3, output: 15}}}}`, dollars \
                 per million tokens), or budget tokens instead"
            ),
        ));
    }
    if let Some((at, _)) = budgets.iter().find(|(_, b)| b.limits_calls())
        && llm.is_some()
        && max_output_tokens(llm).is_none()
    {
        problems.push(Problem::new(
            "llm",
            format!(
                "llm: a money or token budget ({at}) needs `max-tokens` with provider openai: \
                 each call reserves its worst case before it is sent, and the server's own \
                 output limit is not known"
            ),
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_budget_goes_key_by_key_over_its_type() {
        let loop_budget = BudgetDef {
            usd: Some(5.0),
            ..BudgetDef::default()
        };
        let type_budget = BudgetDef {
            usd: Some(1.0),
            iterations: Some(3),
            soft_percent: Some(50),
            ..BudgetDef::default()
        };
        let limits = loop_budget.over(&type_budget).limits();
        assert_eq!(limits.nano_usd, Some(5_000_000_000));
        assert_eq!(limits.iterations, Some(3));
        assert_eq!(limits.soft_percent, 50);
        assert_eq!(BudgetDef::default().limits().soft_percent, 80);
    }

    #[test]
    fn values_that_cannot_be_budgets_are_problems() {
        let bad = BudgetDef {
            usd: Some(-1.0),
            tokens: Some(0),
            soft_percent: Some(0),
            ..BudgetDef::default()
        };
        let at: Vec<String> = bad.problems("budget").into_iter().map(|p| p.at).collect();
        assert_eq!(at, ["budget.usd", "budget.tokens", "budget.soft-percent"]);
        let nan = BudgetDef {
            usd: Some(f64::NAN),
            ..BudgetDef::default()
        };
        assert_eq!(nan.problems("b").len(), 1);
    }
}
