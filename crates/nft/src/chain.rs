//! Chains: regular ones, reached by jumps, and base chains, attached to a netfilter hook.

use std::fmt;

use crate::rule::Rule;

/// The type of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    Filter,
    Nat,
}

impl ChainType {
    /// The name nft and the kernel use.
    pub fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        }
    }
}

/// A netfilter hook of the `inet` family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    /// The name nft uses.
    pub fn name(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }

    /// The kernel's hook number (`NF_INET_*`).
    pub fn number(self) -> u32 {
        match self {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
        }
    }
}

/// What a base chain does with a packet no rule decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainPolicy {
    Accept,
    Drop,
}

/// A base chain's declaration: `type filter hook forward priority -5; policy accept;`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub chain_type: ChainType,
    pub hook: Hook,
    /// Lower runs first. Written by name where nft has one for the type and hook
    /// (`srcnat` = 100 for nat at postrouting), else as the number.
    pub priority: i32,
    pub policy: ChainPolicy,
}

impl BaseChain {
    /// The standard priority name of this type, hook and priority, if nft has one.
    fn priority_name(&self) -> Option<&'static str> {
        match (self.chain_type, self.hook, self.priority) {
            (ChainType::Nat, Hook::Postrouting | Hook::Input, 100) => Some("srcnat"),
            (ChainType::Nat, Hook::Prerouting | Hook::Output, -100) => Some("dstnat"),
            _ => None,
        }
    }
}

impl fmt::Display for BaseChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "type {} hook {} priority ",
            self.chain_type.name(),
            self.hook.name()
        )?;
        match self.priority_name() {
            Some(n) => f.write_str(n)?,
            None => write!(f, "{}", self.priority)?,
        }
        let policy = match self.policy {
            ChainPolicy::Accept => "accept",
            ChainPolicy::Drop => "drop",
        };
        write!(f, "; policy {policy};")
    }
}

/// A chain: a base chain when `base` is set, else a regular chain reached by jumps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

impl Chain {
    /// A regular chain with these rules.
    pub fn regular(rules: Vec<Rule>) -> Chain {
        Chain { base: None, rules }
    }
}
