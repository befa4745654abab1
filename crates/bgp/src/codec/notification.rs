//! NOTIFICATION error codes and subcodes (RFC 4271 §4.5 and §6, RFC 4486, RFC 6608, RFC 7313).

use serde::{Deserialize, Serialize};

/// Defines a `#[repr(u8)]` subcode enum with lossless conversion from and to the wire octet.
macro_rules! subcode_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $val:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[repr(u8)]
        pub enum $name {
            $($(#[$vm])* $var = $val),*
        }

        impl $name {
            /// The subcode for a wire octet, if defined.
            pub fn from_u8(v: u8) -> Option<Self> {
                match v {
                    $($val => Some(Self::$var),)*
                    _ => None,
                }
            }

            /// The wire octet.
            pub fn as_u8(self) -> u8 {
                self as u8
            }
        }
    };
}

subcode_enum! {
    /// Message Header Error subcodes (code 1).
    HeaderSubcode {
        /// The marker is not all ones.
        ConnectionNotSynchronized = 1,
        /// The length field is out of range for the message type; data: the length.
        BadMessageLength = 2,
        /// Unknown message type; data: the type.
        BadMessageType = 3,
    }
}

subcode_enum! {
    /// OPEN Message Error subcodes (code 2).
    OpenSubcode {
        /// No more specific subcode applies.
        Unspecific = 0,
        /// Version not supported; data: the largest supported version (2 octets).
        UnsupportedVersionNumber = 1,
        /// The peer's AS is not the configured one.
        BadPeerAs = 2,
        /// The BGP identifier is not acceptable.
        BadBgpIdentifier = 3,
        /// An optional parameter other than Capabilities.
        UnsupportedOptionalParameter = 4,
        /// Deprecated (RFC 4271 Appendix A).
        AuthenticationFailure = 5,
        /// Hold time of 1 or 2 seconds, or below local policy.
        UnacceptableHoldTime = 6,
        /// A required capability is missing (RFC 5492).
        UnsupportedCapability = 7,
    }
}

subcode_enum! {
    /// UPDATE Message Error subcodes (code 3).
    UpdateSubcode {
        /// No more specific subcode applies.
        Unspecific = 0,
        /// Attribute framing or lengths are inconsistent, or an attribute repeats.
        MalformedAttributeList = 1,
        /// A well-known attribute this speaker does not know; data: the attribute.
        UnrecognizedWellKnownAttribute = 2,
        /// A mandatory well-known attribute is missing; data: its type code.
        MissingWellKnownAttribute = 3,
        /// Flags conflict with the attribute type; data: the attribute.
        AttributeFlagsError = 4,
        /// Length wrong for the attribute type; data: the attribute.
        AttributeLengthError = 5,
        /// ORIGIN value undefined; data: the attribute.
        InvalidOriginAttribute = 6,
        /// Deprecated (RFC 4271 Appendix A).
        AsRoutingLoop = 7,
        /// NEXT_HOP semantically invalid; data: the attribute.
        InvalidNextHopAttribute = 8,
        /// An optional attribute's value is wrong; data: the attribute.
        OptionalAttributeError = 9,
        /// NLRI syntactically wrong.
        InvalidNetworkField = 10,
        /// AS_PATH syntactically wrong.
        MalformedAsPath = 11,
    }
}

subcode_enum! {
    /// Finite State Machine Error subcodes (code 5, RFC 6608).
    FsmSubcode {
        /// Unspecified.
        Unspecified = 0,
        /// Unexpected message in OpenSent.
        UnexpectedMessageInOpenSent = 1,
        /// Unexpected message in OpenConfirm.
        UnexpectedMessageInOpenConfirm = 2,
        /// Unexpected message in Established.
        UnexpectedMessageInEstablished = 3,
    }
}

subcode_enum! {
    /// Cease subcodes (code 6, RFC 4486, RFC 8538).
    CeaseSubcode {
        /// No subcode.
        Unspecific = 0,
        /// Maximum number of prefixes reached.
        MaximumNumberOfPrefixesReached = 1,
        /// Administrative shutdown.
        AdministrativeShutdown = 2,
        /// Peer de-configured.
        PeerDeconfigured = 3,
        /// Administrative reset.
        AdministrativeReset = 4,
        /// Connection rejected.
        ConnectionRejected = 5,
        /// Other configuration change.
        OtherConfigurationChange = 6,
        /// Connection collision resolution.
        ConnectionCollisionResolution = 7,
        /// Out of resources.
        OutOfResources = 8,
        /// Hard reset (RFC 8538).
        HardReset = 9,
        /// BFD down (RFC 9384).
        BfdDown = 10,
    }
}

subcode_enum! {
    /// ROUTE-REFRESH Message Error subcodes (code 7, RFC 7313).
    RouteRefreshSubcode {
        /// Invalid message length.
        InvalidMessageLength = 1,
    }
}

/// A NOTIFICATION error code with its subcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// Message Header Error (1).
    MessageHeader(HeaderSubcode),
    /// OPEN Message Error (2).
    Open(OpenSubcode),
    /// UPDATE Message Error (3).
    Update(UpdateSubcode),
    /// Hold Timer Expired (4, subcode 0).
    HoldTimerExpired,
    /// Finite State Machine Error (5).
    Fsm(FsmSubcode),
    /// Cease (6).
    Cease(CeaseSubcode),
    /// ROUTE-REFRESH Message Error (7).
    RouteRefresh(RouteRefreshSubcode),
    /// A code/subcode pair not listed above, kept as received.
    Unknown {
        /// Error code.
        code: u8,
        /// Error subcode.
        subcode: u8,
    },
}

impl ErrorCode {
    /// Parses a code/subcode pair; pairs outside the known tables become [`ErrorCode::Unknown`].
    pub fn from_wire(code: u8, subcode: u8) -> ErrorCode {
        let known = match code {
            1 => HeaderSubcode::from_u8(subcode).map(ErrorCode::MessageHeader),
            2 => OpenSubcode::from_u8(subcode).map(ErrorCode::Open),
            3 => UpdateSubcode::from_u8(subcode).map(ErrorCode::Update),
            4 if subcode == 0 => Some(ErrorCode::HoldTimerExpired),
            5 => FsmSubcode::from_u8(subcode).map(ErrorCode::Fsm),
            6 => CeaseSubcode::from_u8(subcode).map(ErrorCode::Cease),
            7 => RouteRefreshSubcode::from_u8(subcode).map(ErrorCode::RouteRefresh),
            _ => None,
        };
        known.unwrap_or(ErrorCode::Unknown { code, subcode })
    }

    /// The error code octet.
    pub fn code(self) -> u8 {
        match self {
            ErrorCode::MessageHeader(_) => 1,
            ErrorCode::Open(_) => 2,
            ErrorCode::Update(_) => 3,
            ErrorCode::HoldTimerExpired => 4,
            ErrorCode::Fsm(_) => 5,
            ErrorCode::Cease(_) => 6,
            ErrorCode::RouteRefresh(_) => 7,
            ErrorCode::Unknown { code, .. } => code,
        }
    }

    /// The error subcode octet.
    pub fn subcode(self) -> u8 {
        match self {
            ErrorCode::MessageHeader(s) => s.as_u8(),
            ErrorCode::Open(s) => s.as_u8(),
            ErrorCode::Update(s) => s.as_u8(),
            ErrorCode::HoldTimerExpired => 0,
            ErrorCode::Fsm(s) => s.as_u8(),
            ErrorCode::Cease(s) => s.as_u8(),
            ErrorCode::RouteRefresh(s) => s.as_u8(),
            ErrorCode::Unknown { subcode, .. } => subcode,
        }
    }
}

/// A NOTIFICATION message: error code, subcode and diagnostic data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Notification {
    /// Code and subcode.
    pub error: ErrorCode,
    /// Data whose meaning depends on the code/subcode.
    pub data: Vec<u8>,
}

impl Notification {
    /// A notification with data.
    pub fn new(error: ErrorCode, data: Vec<u8>) -> Notification {
        Notification { error, data }
    }

    /// A notification without data.
    pub fn bare(error: ErrorCode) -> Notification {
        Notification {
            error,
            data: Vec::new(),
        }
    }
}

impl std::fmt::Display for Notification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} (code {}, subcode {}",
            self.error,
            self.error.code(),
            self.error.subcode()
        )?;
        if !self.data.is_empty() {
            write!(f, ", data ")?;
            for b in &self.data {
                write!(f, "{b:02x}")?;
            }
        }
        write!(f, ")")
    }
}
