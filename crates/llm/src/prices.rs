//! What model calls cost: a price per token for input billed at the full rate, output,
//! cache reads and cache writes, built in for the common Anthropic and OpenAI models and
//! overridable per model in `taskdaemon.yml` (`prices:`).
//!
//! Prices are kept in nano-dollars per token (a dollar per million tokens is 1,000
//! nano-dollars per token), so every published price is a whole number and costs add up
//! exactly, with checked arithmetic. A model with no price has no cost: it is shown as
//! "unknown price", never as $0.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::Usage;

/// Nano-dollars (10⁻⁹ USD) per token, per kind of token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price {
    /// Prompt tokens billed at the full rate.
    pub input: u64,
    /// Completion tokens.
    pub output: u64,
    /// Prompt tokens read from the prompt cache.
    pub cache_read: u64,
    /// Prompt tokens written to the prompt cache.
    pub cache_write: u64,
}

impl Price {
    /// A price from thousandths of a dollar per million tokens (which are exactly
    /// nano-dollars per token): input, output, cache read, cache write.
    const fn per_million_milli(
        input: u64,
        output: u64,
        cache_read: u64,
        cache_write: u64,
    ) -> Price {
        Price {
            input,
            output,
            cache_read,
            cache_write,
        }
    }

    /// The cost of `usage` in nano-dollars; `None` if it is past what a u64 holds.
    pub fn cost(&self, usage: &Usage) -> Option<u64> {
        let parts = [
            usage.input_tokens.checked_mul(self.input)?,
            usage.output_tokens.checked_mul(self.output)?,
            usage.cache_read_tokens.checked_mul(self.cache_read)?,
            usage.cache_write_tokens.checked_mul(self.cache_write)?,
        ];
        parts.iter().try_fold(0u64, |sum, p| sum.checked_add(*p))
    }

    /// The most a prompt token can cost (full rate, cache read or cache write): what a
    /// reservation charges per input token, not knowing how the provider will bill it.
    pub fn dearest_input(&self) -> u64 {
        self.input.max(self.cache_read).max(self.cache_write)
    }
}

/// The built-in prices, in thousandths of a dollar per million tokens (= nano-dollars per
/// token): (model, input, output, cache read, cache write).
///
/// Sources: Anthropic's pricing page (docs.anthropic.com, "Pricing"; cache writes are the
/// 5-minute rate, 1.25× input; cache reads 0.1× input) and OpenAI's (openai.com/api/pricing;
/// OpenAI bills no cache writes, so they cost the input rate, and its cached input is the
/// cache read rate). Figures as published on those pages, with the date each model's price
/// was announced: Claude Opus 4.5 2025-11-24, Claude Haiku 4.5 2025-10-15, Claude Sonnet 4.5
/// 2025-09-29, Claude Opus 4.1 2025-08-05, Claude Opus 4 and Sonnet 4 2025-05-22, Claude 3.7
/// Sonnet 2025-02-24, Claude 3.5 Haiku 2024-11-04, Claude 3.5 Sonnet 2024-06-20, Claude 3
/// Opus and Haiku 2024-03-04 (Haiku 2024-03-13); GPT-5, -mini, -nano 2025-08-07, o3 (after its
/// price cut) 2025-06-10, GPT-4.1, -mini, -nano 2025-04-14, o4-mini 2025-04-16, o3-mini
/// 2025-01-31, GPT-4o-mini 2024-07-18, GPT-4o (2024-08-06 price) 2024-08-06. Long-context
/// surcharges (Sonnet past 200k input tokens) and batch discounts are not modelled; override
/// a model in `prices:` when your bill says otherwise.
const BUILTIN: &[(&str, u64, u64, u64, u64)] = &[
    // Anthropic
    ("claude-opus-4-5", 5_000, 25_000, 500, 6_250),
    ("claude-opus-4-1", 15_000, 75_000, 1_500, 18_750),
    ("claude-opus-4", 15_000, 75_000, 1_500, 18_750),
    ("claude-sonnet-4-5", 3_000, 15_000, 300, 3_750),
    ("claude-sonnet-4", 3_000, 15_000, 300, 3_750),
    ("claude-haiku-4-5", 1_000, 5_000, 100, 1_250),
    ("claude-3-7-sonnet", 3_000, 15_000, 300, 3_750),
    ("claude-3-5-sonnet", 3_000, 15_000, 300, 3_750),
    ("claude-3-5-haiku", 800, 4_000, 80, 1_000),
    ("claude-3-opus", 15_000, 75_000, 1_500, 18_750),
    ("claude-3-haiku", 250, 1_250, 30, 300),
    // OpenAI
    ("gpt-5", 1_250, 10_000, 125, 1_250),
    ("gpt-5-mini", 250, 2_000, 25, 250),
    ("gpt-5-nano", 50, 400, 5, 50),
    ("gpt-4.1", 2_000, 8_000, 500, 2_000),
    ("gpt-4.1-mini", 400, 1_600, 100, 400),
    ("gpt-4.1-nano", 100, 400, 25, 100),
    ("gpt-4o", 2_500, 10_000, 1_250, 2_500),
    ("gpt-4o-mini", 150, 600, 75, 150),
    ("o3", 2_000, 8_000, 500, 2_000),
    ("o3-mini", 1_100, 4_400, 550, 1_100),
    ("o4-mini", 1_100, 4_400, 275, 1_100),
];

/// The built-in price of a model name exactly as the table writes it.
fn builtin(model: &str) -> Option<Price> {
    BUILTIN
        .iter()
        .find(|(name, ..)| *name == model)
        .map(|&(_, i, o, r, w)| Price::per_million_milli(i, o, r, w))
}

/// A price as written in `taskdaemon.yml`: dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PriceConfig {
    /// Dollars per million input tokens (billed at the full rate).
    pub input: f64,
    /// Dollars per million output tokens.
    pub output: f64,
    /// Dollars per million tokens read from the prompt cache (default: the input price).
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Dollars per million tokens written to the prompt cache (default: the input price).
    #[serde(default)]
    pub cache_write: Option<f64>,
}

/// The most a price may be, in dollars per million tokens: far above any model's, and small
/// enough that a price times any token count a run reaches stays exact.
pub const MAX_PRICE_PER_MILLION: f64 = 1_000_000.0;

impl PriceConfig {
    /// The price in nano-dollars per token, or why it cannot be one (negative, not a
    /// number, too large, or finer than a thousandth of a dollar per million tokens).
    pub fn price(&self) -> Result<Price, String> {
        let convert = |key: &str, dollars: f64| -> Result<u64, String> {
            if !dollars.is_finite() || !(0.0..=MAX_PRICE_PER_MILLION).contains(&dollars) {
                return Err(format!(
                    "`{key}` is {dollars}: a price is dollars per million tokens, from 0 to {MAX_PRICE_PER_MILLION}"
                ));
            }
            let nano = dollars * 1000.0;
            if (nano - nano.round()).abs() > 1e-6 {
                return Err(format!(
                    "`{key}` is {dollars}: prices are counted in thousandths of a dollar per million tokens"
                ));
            }
            // In range and whole: the cast is exact.
            Ok(nano.round() as u64)
        };
        let input = convert("input", self.input)?;
        Ok(Price {
            input,
            output: convert("output", self.output)?,
            cache_read: self
                .cache_read
                .map(|p| convert("cache-read", p))
                .transpose()?
                .unwrap_or(input),
            cache_write: self
                .cache_write
                .map(|p| convert("cache-write", p))
                .transpose()?
                .unwrap_or(input),
        })
    }
}

/// The prices a run uses: the built-in table with the config's overrides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    overrides: BTreeMap<String, Price>,
}

impl PriceTable {
    /// The built-in table with `overrides` (model name → price) on top.
    pub fn new(overrides: BTreeMap<String, Price>) -> Self {
        PriceTable { overrides }
    }

    /// The price of `model`: an override of that exact name, else the built-in price of
    /// that name, else of the longest built-in name the model's name extends with a `-`
    /// (`claude-sonnet-4-5-20250929` is priced as `claude-sonnet-4-5`, `gpt-4o-2024-08-06`
    /// as `gpt-4o`, while `gpt-4o-mini` has its own price). `None`: unknown price.
    pub fn lookup(&self, model: &str) -> Option<Price> {
        if let Some(p) = self.overrides.get(model) {
            return Some(*p);
        }
        if let Some(p) = builtin(model) {
            return Some(p);
        }
        BUILTIN
            .iter()
            .filter(|(name, ..)| {
                model
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('-'))
            })
            .max_by_key(|(name, ..)| name.len())
            .map(|&(_, i, o, r, w)| Price::per_million_milli(i, o, r, w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_names_take_the_price_of_their_model_and_the_longest_name_wins() {
        let table = PriceTable::default();
        let sonnet = table.lookup("claude-sonnet-4-5").unwrap();
        assert_eq!(table.lookup("claude-sonnet-4-5-20250929"), Some(sonnet));
        assert_eq!(sonnet.input, 3_000);
        assert_eq!(table.lookup("gpt-4o-2024-08-06").unwrap().input, 2_500);
        assert_eq!(table.lookup("gpt-4o-mini").unwrap().input, 150);
        assert_eq!(table.lookup("gpt-4o-mini-2024-07-18").unwrap().input, 150);
        assert_eq!(table.lookup("gpt-4"), None);
        assert_eq!(table.lookup("gpt-4ox"), None);
        assert_eq!(table.lookup("scripted"), None);
        assert_eq!(table.lookup("smollm2"), None);
    }

    #[test]
    fn overrides_win_and_costs_are_exact() {
        let custom = PriceConfig {
            input: 0.075,
            output: 3.0,
            cache_read: None,
            cache_write: Some(1.25),
        }
        .price()
        .unwrap();
        assert_eq!(
            custom,
            Price {
                input: 75,
                output: 3_000,
                cache_read: 75,
                cache_write: 1_250
            }
        );
        let table = PriceTable::new(BTreeMap::from([("gpt-4o".to_string(), custom)]));
        assert_eq!(table.lookup("gpt-4o"), Some(custom));
        // Only the exact name is overridden.
        assert_eq!(table.lookup("gpt-4o-2024-08-06").unwrap().input, 2_500);
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 2,
            cache_read_tokens: 10,
            cache_write_tokens: 1,
            estimated: false,
        };
        assert_eq!(custom.cost(&usage), Some(75_000_000 + 6_000 + 750 + 1_250));
        assert_eq!(custom.dearest_input(), 1_250);
        let huge = Usage {
            input_tokens: u64::MAX,
            ..Usage::default()
        };
        assert_eq!(custom.cost(&huge), None);
    }

    #[test]
    fn prices_that_cannot_be_are_refused() {
        for (input, needle) in [
            (-1.0, "from 0"),
            (f64::NAN, "from 0"),
            (f64::INFINITY, "from 0"),
            (2e6, "from 0"),
            (0.0001, "thousandths"),
        ] {
            let e = PriceConfig {
                input,
                output: 1.0,
                cache_read: None,
                cache_write: None,
            }
            .price()
            .unwrap_err();
            assert!(e.contains("`input`") && e.contains(needle), "{e}");
        }
    }
}
