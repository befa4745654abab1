//! The tags of flow records: what a compiled rule writes in the prefix of its NFLOG event, so
//! the agent knows which rule of which policy took a connection's first packet.
//!
//! With flow records on ([`crate::compile::FlowLog`]), every rule that ends a direction's walk
//! logs its tag to the NFLOG group just before its verdict, so a new connection yields exactly
//! one event per direction at a local pod:
//!
//! | tag | rule |
//! |---|---|
//! | `t:<hash>:<i\|e>:<index>:<a\|d\|p>` | a policy's rule (`IrRule::index`, as written) that allows, denies or passes; `<hash>` is `short_hash` of the policy key, as in its chain's name |
//! | `t:dd:<i\|e>` | the endpoint chain's final drop: the default deny |
//! | `t:fp:<i\|e>` | the endpoint chain's fast path (an allow; the agent names the rule by `explain`) |
//! | `t:np:<i\|e>` | the shared chain of endpoints no policy selects in that direction |
//!
//! The text is made here and parsed back here only ([`FlowTag::parse`], bounded: a prefix is
//! at most [`MAX_TAG_LEN`] bytes).

use std::fmt;

use tern_model::Action;

use crate::model::Direction;

/// The longest tag [`FlowTag::parse`] reads (the kernel's log prefix holds 127 bytes).
pub const MAX_TAG_LEN: usize = 64;

/// What a policy rule did, in its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagAction {
    Allow,
    Deny,
    Pass,
}

impl TagAction {
    /// The tag's letter for a rule's action; `None` for Log, which ends nothing.
    pub fn of(a: Action) -> Option<TagAction> {
        match a {
            Action::Allow => Some(TagAction::Allow),
            Action::Deny => Some(TagAction::Deny),
            Action::Pass => Some(TagAction::Pass),
            Action::Log => None,
        }
    }

    /// Whether the packet goes on (Allow, and Pass: the profile allows).
    pub fn allows(self) -> bool {
        !matches!(self, TagAction::Deny)
    }

    fn letter(self) -> char {
        match self {
            TagAction::Allow => 'a',
            TagAction::Deny => 'd',
            TagAction::Pass => 'p',
        }
    }
}

/// What an NFLOG event's prefix says decided a direction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FlowTag {
    /// A policy's rule: the policy by the hash of its key, the rule as written.
    Rule {
        policy_hash: String,
        direction: Direction,
        index: usize,
        action: TagAction,
    },
    /// The default deny of the endpoint's chain.
    DefaultDeny(Direction),
    /// The fast path allowed.
    FastPath(Direction),
    /// No policy selects the endpoint in this direction.
    NoPolicy(Direction),
}

fn dir_letter(d: Direction) -> char {
    match d {
        Direction::Ingress => 'i',
        Direction::Egress => 'e',
    }
}

fn dir_of(s: &str) -> Option<Direction> {
    match s {
        "i" => Some(Direction::Ingress),
        "e" => Some(Direction::Egress),
        _ => None,
    }
}

impl FlowTag {
    /// The direction the tag was logged in.
    pub fn direction(&self) -> Direction {
        match self {
            FlowTag::Rule { direction, .. } => *direction,
            FlowTag::DefaultDeny(d) | FlowTag::FastPath(d) | FlowTag::NoPolicy(d) => *d,
        }
    }

    /// Whether the tagged rule lets the packet on.
    pub fn allows(&self) -> bool {
        match self {
            FlowTag::Rule { action, .. } => action.allows(),
            FlowTag::DefaultDeny(_) => false,
            FlowTag::FastPath(_) | FlowTag::NoPolicy(_) => true,
        }
    }

    /// Reads a tag back from a log prefix; `None` for anything else (not ours, or malformed).
    pub fn parse(s: &str) -> Option<FlowTag> {
        if s.len() > MAX_TAG_LEN {
            return None;
        }
        let mut it = s.split(':');
        if it.next()? != "t" {
            return None;
        }
        let second = it.next()?;
        let dir = dir_of(it.next()?)?;
        let tag = match second {
            "dd" => FlowTag::DefaultDeny(dir),
            "fp" => FlowTag::FastPath(dir),
            "np" => FlowTag::NoPolicy(dir),
            hash if hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
                let index: usize = it.next()?.parse().ok()?;
                let action = match it.next()? {
                    "a" => TagAction::Allow,
                    "d" => TagAction::Deny,
                    "p" => TagAction::Pass,
                    _ => return None,
                };
                FlowTag::Rule {
                    policy_hash: hash.to_string(),
                    direction: dir,
                    index,
                    action,
                }
            }
            _ => return None,
        };
        if it.next().is_some() {
            return None;
        }
        Some(tag)
    }
}

impl fmt::Display for FlowTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowTag::Rule {
                policy_hash,
                direction,
                index,
                action,
            } => write!(
                f,
                "t:{policy_hash}:{}:{index}:{}",
                dir_letter(*direction),
                action.letter()
            ),
            FlowTag::DefaultDeny(d) => write!(f, "t:dd:{}", dir_letter(*d)),
            FlowTag::FastPath(d) => write!(f, "t:fp:{}", dir_letter(*d)),
            FlowTag::NoPolicy(d) => write!(f, "t:np:{}", dir_letter(*d)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_read_as_documented() {
        let tags = [
            FlowTag::Rule {
                policy_hash: "0123456789ab".into(),
                direction: Direction::Ingress,
                index: 12,
                action: TagAction::Deny,
            },
            FlowTag::Rule {
                policy_hash: "fedcba987654".into(),
                direction: Direction::Egress,
                index: 0,
                action: TagAction::Pass,
            },
            FlowTag::DefaultDeny(Direction::Egress),
            FlowTag::FastPath(Direction::Ingress),
            FlowTag::NoPolicy(Direction::Egress),
        ];
        for t in &tags {
            assert_eq!(FlowTag::parse(&t.to_string()).as_ref(), Some(t), "{t}");
        }
        assert_eq!(tags[0].to_string(), "t:0123456789ab:i:12:d");
        assert_eq!(tags[2].to_string(), "t:dd:e");
        assert!(!tags[0].allows() && tags[1].allows() && !tags[2].allows());
        assert!(tags[3].allows() && tags[4].allows());
    }

    #[test]
    fn other_prefixes_are_not_tags() {
        for bad in [
            "",
            "t",
            "t:dd",
            "t:dd:x",
            "t:dd:i:extra",
            "t:xx:i",
            "t:0123456789ab:i:1",
            "t:0123456789ab:i:1:z",
            "t:0123456789ab:i:-1:a",
            "t:0123456789aX:i:1:a",
            "t:0123456789a:i:1:a",
            "tern 0123456789ab-i0: ",
            "u:dd:i",
        ] {
            assert_eq!(FlowTag::parse(bad), None, "{bad:?}");
        }
        let long = format!("t:dd:i{}", " ".repeat(MAX_TAG_LEN));
        assert_eq!(FlowTag::parse(&long), None);
    }
}
