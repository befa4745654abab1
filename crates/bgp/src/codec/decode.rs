//! Decoding with RFC 4271 §6 / RFC 7606 error classification. Never panics: every read goes
//! through [`Reader`], which returns `None` instead of indexing past the end.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use super::notification::{ErrorCode, HeaderSubcode, Notification, OpenSubcode, UpdateSubcode};
use super::{
    AsSegment, BGP_VERSION, Capability, CodecOptions, FLAG_EXTENDED, FLAG_OPTIONAL,
    FLAG_TRANSITIVE, Family, GracefulRestart, GracefulRestartFamily, HEADER_LEN, MAX_MESSAGE_LEN,
    Message, MpReach, MpUnreach, Open, Origin, PathAttribute, RouteRefresh, SegmentType,
    UnknownAttribute, Update,
};

/// What the receiver must do about a decode error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorAction {
    /// Send the NOTIFICATION and close the session (RFC 4271 §6).
    SessionReset,
    /// RFC 7606 treat-as-withdraw: the UPDATE's attributes are malformed but its NLRI could be
    /// located. The session stays up and these prefixes are withdrawn from the sender; the
    /// NOTIFICATION is what RFC 4271 would have sent and is kept only for logging.
    TreatAsWithdraw(Vec<IpNet>),
}

/// A message that could not be accepted, with the protocol answer it calls for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{context}: {notification}")]
pub struct DecodeError {
    /// The NOTIFICATION to send (code, subcode and data per RFC 4271 §6).
    pub notification: Notification,
    /// Reset the session or withdraw the affected routes.
    pub action: ErrorAction,
    /// What was wrong, for logs.
    pub context: String,
}

impl DecodeError {
    /// A session-resetting error.
    pub(crate) fn reset(error: ErrorCode, data: Vec<u8>, context: impl Into<String>) -> Self {
        DecodeError {
            notification: Notification::new(error, data),
            action: ErrorAction::SessionReset,
            context: context.into(),
        }
    }

    /// Whether the session must be reset.
    pub fn is_session_reset(&self) -> bool {
        self.action == ErrorAction::SessionReset
    }
}

/// Bounds-checked big-endian reader.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn rest(&mut self) -> &'a [u8] {
        let s = self.buf.get(self.pos..).unwrap_or(&[]);
        self.pos = self.buf.len();
        s
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).and_then(|s| s.first().copied())
    }

    fn u16(&mut self) -> Option<u16> {
        let s = self.take(2)?;
        Some(u16::from_be_bytes(s.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        let s = self.take(4)?;
        Some(u32::from_be_bytes(s.try_into().ok()?))
    }

    fn ipv4(&mut self) -> Option<Ipv4Addr> {
        self.u32().map(Ipv4Addr::from)
    }

    fn ipv6(&mut self) -> Option<Ipv6Addr> {
        let s = self.take(16)?;
        let a: [u8; 16] = s.try_into().ok()?;
        Some(Ipv6Addr::from(a))
    }
}

fn header_err(sub: HeaderSubcode, data: Vec<u8>, context: impl Into<String>) -> DecodeError {
    DecodeError::reset(ErrorCode::MessageHeader(sub), data, context)
}

fn open_err(sub: OpenSubcode, data: Vec<u8>, context: impl Into<String>) -> DecodeError {
    DecodeError::reset(ErrorCode::Open(sub), data, context)
}

fn update_reset(sub: UpdateSubcode, data: Vec<u8>, context: impl Into<String>) -> DecodeError {
    DecodeError::reset(ErrorCode::Update(sub), data, context)
}

/// Validates a 19-octet header: marker, length range for the type, known type.
/// Returns the message length and type.
pub(crate) fn check_header(header: &[u8]) -> Result<(usize, u8), DecodeError> {
    let mut r = Reader::new(header);
    let marker = r
        .take(16)
        .ok_or_else(|| header_err(HeaderSubcode::BadMessageLength, Vec::new(), "short header"))?;
    if marker.iter().any(|b| *b != 0xff) {
        return Err(header_err(
            HeaderSubcode::ConnectionNotSynchronized,
            Vec::new(),
            "header marker is not all ones",
        ));
    }
    let (Some(len), Some(typ)) = (r.u16(), r.u8()) else {
        return Err(header_err(
            HeaderSubcode::BadMessageLength,
            Vec::new(),
            "short header",
        ));
    };
    let bad_len = || {
        header_err(
            HeaderSubcode::BadMessageLength,
            len.to_be_bytes().to_vec(),
            format!("message length {len} invalid for message type {typ}"),
        )
    };
    let n = usize::from(len);
    if !(HEADER_LEN..=MAX_MESSAGE_LEN).contains(&n) {
        return Err(bad_len());
    }
    let ok = match typ {
        1 => n >= HEADER_LEN + 10,
        2 => n >= HEADER_LEN + 4,
        3 => n >= HEADER_LEN + 2,
        4 => n == HEADER_LEN,
        5 => n == HEADER_LEN + 4,
        _ => {
            return Err(header_err(
                HeaderSubcode::BadMessageType,
                vec![typ],
                format!("unknown message type {typ}"),
            ));
        }
    };
    if !ok {
        return Err(bad_len());
    }
    Ok((n, typ))
}

/// Decodes one whole message (header included) with default options (4-octet AS).
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    decode_with(bytes, CodecOptions::default())
}

/// Decodes one whole message (header included).
pub fn decode_with(bytes: &[u8], opts: CodecOptions) -> Result<Message, DecodeError> {
    if bytes.len() < HEADER_LEN {
        let n = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
        return Err(header_err(
            HeaderSubcode::BadMessageLength,
            n.to_be_bytes().to_vec(),
            format!("{} octets is shorter than a BGP header", bytes.len()),
        ));
    }
    let (len, typ) = check_header(bytes.get(..HEADER_LEN).unwrap_or(&[]))?;
    if len != bytes.len() {
        let n = u16::try_from(len).unwrap_or(u16::MAX);
        return Err(header_err(
            HeaderSubcode::BadMessageLength,
            n.to_be_bytes().to_vec(),
            format!("length field {len} but {} octets given", bytes.len()),
        ));
    }
    let body = bytes.get(HEADER_LEN..).unwrap_or(&[]);
    match typ {
        1 => decode_open(body).map(Message::Open),
        2 => decode_update(body, opts).map(Message::Update),
        3 => decode_notification(body).map(Message::Notification),
        4 => Ok(Message::Keepalive),
        _ => decode_route_refresh(body).map(Message::RouteRefresh),
    }
}

fn decode_notification(body: &[u8]) -> Result<Notification, DecodeError> {
    let mut r = Reader::new(body);
    let (Some(code), Some(subcode)) = (r.u8(), r.u8()) else {
        return Err(header_err(
            HeaderSubcode::BadMessageLength,
            Vec::new(),
            "NOTIFICATION too short",
        ));
    };
    Ok(Notification::new(
        ErrorCode::from_wire(code, subcode),
        r.rest().to_vec(),
    ))
}

fn decode_route_refresh(body: &[u8]) -> Result<RouteRefresh, DecodeError> {
    let mut r = Reader::new(body);
    let (Some(afi), Some(subtype), Some(safi)) = (r.u16(), r.u8(), r.u8()) else {
        return Err(header_err(
            HeaderSubcode::BadMessageLength,
            Vec::new(),
            "ROUTE-REFRESH too short",
        ));
    };
    Ok(RouteRefresh {
        family: Family { afi, safi },
        subtype,
    })
}

fn decode_open(body: &[u8]) -> Result<Open, DecodeError> {
    let mut r = Reader::new(body);
    let short = || open_err(OpenSubcode::Unspecific, Vec::new(), "OPEN too short");
    let version = r.u8().ok_or_else(short)?;
    if version != BGP_VERSION {
        return Err(open_err(
            OpenSubcode::UnsupportedVersionNumber,
            u16::from(BGP_VERSION).to_be_bytes().to_vec(),
            format!("peer speaks BGP version {version}, only 4 is supported"),
        ));
    }
    let my_as = r.u16().ok_or_else(short)?;
    let hold_time = r.u16().ok_or_else(short)?;
    let bgp_id = r.ipv4().ok_or_else(short)?;
    let opt_len = r.u8().ok_or_else(short)?;
    let params = r.take(usize::from(opt_len)).ok_or_else(|| {
        open_err(
            OpenSubcode::Unspecific,
            Vec::new(),
            format!("optional parameters length {opt_len} exceeds the message"),
        )
    })?;
    if !r.is_empty() {
        return Err(open_err(
            OpenSubcode::Unspecific,
            Vec::new(),
            "trailing octets after the optional parameters",
        ));
    }
    let mut capabilities = Vec::new();
    let mut pr = Reader::new(params);
    while !pr.is_empty() {
        let malformed = || open_err(OpenSubcode::Unspecific, Vec::new(), "truncated parameter");
        let ptype = pr.u8().ok_or_else(malformed)?;
        let plen = pr.u8().ok_or_else(malformed)?;
        let pval = pr.take(usize::from(plen)).ok_or_else(malformed)?;
        if ptype != 2 {
            return Err(open_err(
                OpenSubcode::UnsupportedOptionalParameter,
                Vec::new(),
                format!("optional parameter type {ptype} is not Capabilities (2)"),
            ));
        }
        let mut cr = Reader::new(pval);
        while !cr.is_empty() {
            let code = cr.u8().ok_or_else(malformed)?;
            let clen = cr.u8().ok_or_else(malformed)?;
            let cval = cr.take(usize::from(clen)).ok_or_else(|| {
                open_err(
                    OpenSubcode::Unspecific,
                    Vec::new(),
                    format!("capability {code} length {clen} exceeds its parameter"),
                )
            })?;
            capabilities.push(decode_capability(code, cval)?);
        }
    }
    Ok(Open {
        version,
        my_as,
        hold_time,
        bgp_id,
        capabilities,
    })
}

fn decode_capability(code: u8, value: &[u8]) -> Result<Capability, DecodeError> {
    let bad = || {
        let mut data = vec![code, u8::try_from(value.len()).unwrap_or(u8::MAX)];
        data.extend_from_slice(value);
        open_err(
            OpenSubcode::Unspecific,
            data,
            format!("capability {code} has invalid length {}", value.len()),
        )
    };
    let mut r = Reader::new(value);
    match code {
        1 => {
            if value.len() != 4 {
                return Err(bad());
            }
            let afi = r.u16().ok_or_else(bad)?;
            let _reserved = r.u8();
            let safi = r.u8().ok_or_else(bad)?;
            Ok(Capability::Multiprotocol(Family { afi, safi }))
        }
        2 => {
            if !value.is_empty() {
                return Err(bad());
            }
            Ok(Capability::RouteRefresh)
        }
        64 => {
            if value.len() < 2 || !(value.len() - 2).is_multiple_of(4) {
                return Err(bad());
            }
            let word = r.u16().ok_or_else(bad)?;
            let flags = (word >> 12) as u8;
            let mut families = Vec::new();
            while !r.is_empty() {
                let afi = r.u16().ok_or_else(bad)?;
                let safi = r.u8().ok_or_else(bad)?;
                let f = r.u8().ok_or_else(bad)?;
                families.push(GracefulRestartFamily {
                    family: Family { afi, safi },
                    forwarding_preserved: f & 0x80 != 0,
                    other_flags: f & 0x7f,
                });
            }
            Ok(Capability::GracefulRestart(GracefulRestart {
                restart_state: flags & 0x8 != 0,
                other_flags: flags & 0x7,
                restart_time: word & 0x0fff,
                families,
            }))
        }
        65 => {
            if value.len() != 4 {
                return Err(bad());
            }
            Ok(Capability::FourOctetAs(r.u32().ok_or_else(bad)?))
        }
        _ => Ok(Capability::Unknown {
            code,
            value: value.to_vec(),
        }),
    }
}

/// Parses a run of (length, prefix) NLRI entries.
pub(crate) fn parse_prefixes(bytes: &[u8], v6: bool) -> Result<Vec<IpNet>, String> {
    let mut r = Reader::new(bytes);
    let mut out = Vec::new();
    let max = if v6 { 128u8 } else { 32u8 };
    while !r.is_empty() {
        let len = r
            .u8()
            .ok_or_else(|| "truncated prefix length".to_string())?;
        if len > max {
            return Err(format!("prefix length {len} exceeds {max}"));
        }
        let nbytes = usize::from(len).div_ceil(8);
        let b = r
            .take(nbytes)
            .ok_or_else(|| format!("prefix of length {len} truncated"))?;
        let net = if v6 {
            let mut a = [0u8; 16];
            for (d, s) in a.iter_mut().zip(b) {
                *d = *s;
            }
            Ipv6Net::new(Ipv6Addr::from(a), len)
                .map(|n| IpNet::V6(n.trunc()))
                .map_err(|e| e.to_string())?
        } else {
            let mut a = [0u8; 4];
            for (d, s) in a.iter_mut().zip(b) {
                *d = *s;
            }
            Ipv4Net::new(Ipv4Addr::from(a), len)
                .map(|n| IpNet::V4(n.trunc()))
                .map_err(|e| e.to_string())?
        };
        out.push(net);
    }
    Ok(out)
}

fn parse_v4_prefixes(bytes: &[u8], field: &str) -> Result<Vec<Ipv4Net>, DecodeError> {
    let nets = parse_prefixes(bytes, false).map_err(|e| {
        update_reset(
            UpdateSubcode::InvalidNetworkField,
            Vec::new(),
            format!("{field}: {e}"),
        )
    })?;
    Ok(nets
        .into_iter()
        .filter_map(|n| match n {
            IpNet::V4(n) => Some(n),
            IpNet::V6(_) => None,
        })
        .collect())
}

/// How one attribute's problem is handled (RFC 7606 §2).
enum AttrError {
    Reset(DecodeError),
    Withdraw(Notification, String),
    Discard,
}

fn decode_update(body: &[u8], opts: CodecOptions) -> Result<Update, DecodeError> {
    let mut r = Reader::new(body);
    let overrun = |what: &str| {
        update_reset(
            UpdateSubcode::MalformedAttributeList,
            Vec::new(),
            format!("{what} length exceeds the UPDATE"),
        )
    };
    let wlen = r.u16().ok_or_else(|| overrun("withdrawn routes"))?;
    let wbytes = r
        .take(usize::from(wlen))
        .ok_or_else(|| overrun("withdrawn routes"))?;
    let alen = r.u16().ok_or_else(|| overrun("total path attribute"))?;
    let abytes = r
        .take(usize::from(alen))
        .ok_or_else(|| overrun("total path attribute"))?;
    let nbytes = r.rest();
    let withdrawn = parse_v4_prefixes(wbytes, "withdrawn routes")?;
    let nlri = parse_v4_prefixes(nbytes, "NLRI")?;

    let mut attributes = Vec::new();
    let mut seen = [false; 256];
    let mut withdraw: Option<(Notification, String)> = None;
    let mut ar = Reader::new(abytes);
    while !ar.is_empty() {
        let start = ar.pos;
        let flags = ar.u8();
        let typ = ar.u8();
        let len = match flags {
            Some(f) if f & FLAG_EXTENDED != 0 => ar.u16().map(usize::from),
            Some(_) => ar.u8().map(usize::from),
            None => None,
        };
        let value = len.and_then(|l| ar.take(l));
        let (Some(flags), Some(typ), Some(value)) = (flags, typ, value) else {
            // RFC 7606 §4: trust the total length to find the NLRI; but MP attributes may
            // have been lost, and then the routes cannot be withdrawn reliably.
            if seen[14] || seen[15] {
                return Err(update_reset(
                    UpdateSubcode::MalformedAttributeList,
                    Vec::new(),
                    "path attribute overruns the attribute section",
                ));
            }
            withdraw.get_or_insert((
                Notification::new(
                    ErrorCode::Update(UpdateSubcode::MalformedAttributeList),
                    Vec::new(),
                ),
                "path attribute overruns the attribute section".into(),
            ));
            break;
        };
        let raw = abytes.get(start..ar.pos).unwrap_or(&[]);
        let idx = usize::from(typ);
        if seen[idx] {
            if typ == 14 || typ == 15 {
                return Err(update_reset(
                    UpdateSubcode::MalformedAttributeList,
                    Vec::new(),
                    format!("attribute {typ} appears twice"),
                ));
            }
            // RFC 7606 §3.g: discard all but the first occurrence.
            continue;
        }
        seen[idx] = true;
        match decode_attribute(flags, typ, value, raw, opts) {
            Ok(a) => attributes.push(a),
            Err(AttrError::Discard) => {}
            Err(AttrError::Reset(e)) => return Err(e),
            Err(AttrError::Withdraw(n, ctx)) => {
                withdraw.get_or_insert((n, ctx));
            }
        }
    }

    let has_reach = attributes
        .iter()
        .any(|a| matches!(a, PathAttribute::MpReach(_)));
    if withdraw.is_none() && (!nlri.is_empty() || has_reach) {
        let mut mandatory = vec![1u8, 2];
        if !nlri.is_empty() {
            mandatory.push(3);
        }
        if let Some(t) = mandatory.into_iter().find(|t| !seen[usize::from(*t)]) {
            withdraw = Some((
                Notification::new(
                    ErrorCode::Update(UpdateSubcode::MissingWellKnownAttribute),
                    vec![t],
                ),
                format!("mandatory attribute {t} missing"),
            ));
        }
    }

    let update = Update {
        withdrawn,
        attributes,
        nlri,
    };
    if let Some((notification, context)) = withdraw {
        let mut prefixes = update.all_withdrawn();
        prefixes.extend(update.all_announced().into_iter().map(|(p, _)| p));
        return Err(DecodeError {
            notification,
            action: ErrorAction::TreatAsWithdraw(prefixes),
            context,
        });
    }
    Ok(update)
}

fn decode_attribute(
    flags: u8,
    typ: u8,
    value: &[u8],
    raw: &[u8],
    opts: CodecOptions,
) -> Result<PathAttribute, AttrError> {
    let withdraw = |sub: UpdateSubcode, ctx: String| {
        AttrError::Withdraw(Notification::new(ErrorCode::Update(sub), raw.to_vec()), ctx)
    };
    let reset =
        |sub: UpdateSubcode, ctx: String| AttrError::Reset(update_reset(sub, raw.to_vec(), ctx));
    let expected = match typ {
        1 | 2 | 3 | 5 | 6 => Some(FLAG_TRANSITIVE),
        4 | 9 | 10 | 14 | 15 => Some(FLAG_OPTIONAL),
        7 | 8 => Some(FLAG_OPTIONAL | FLAG_TRANSITIVE),
        _ => None,
    };
    let Some(expected) = expected else {
        if flags & FLAG_OPTIONAL == 0 {
            return Err(reset(
                UpdateSubcode::UnrecognizedWellKnownAttribute,
                format!("unrecognized well-known attribute {typ}"),
            ));
        }
        return Ok(PathAttribute::Unknown(UnknownAttribute {
            flags: flags & !FLAG_EXTENDED,
            type_code: typ,
            value: value.to_vec(),
        }));
    };
    if flags & (FLAG_OPTIONAL | FLAG_TRANSITIVE) != expected {
        let ctx = format!("attribute {typ} has flags {flags:#04x}");
        return Err(match typ {
            14 | 15 => reset(UpdateSubcode::AttributeFlagsError, ctx),
            6 | 7 => AttrError::Discard,
            _ => withdraw(UpdateSubcode::AttributeFlagsError, ctx),
        });
    }
    let mut r = Reader::new(value);
    let len_err = |what: &str| {
        withdraw(
            UpdateSubcode::AttributeLengthError,
            format!("{what} attribute has length {}", value.len()),
        )
    };
    match typ {
        1 => {
            if value.len() != 1 {
                return Err(len_err("ORIGIN"));
            }
            match r.u8() {
                Some(0) => Ok(PathAttribute::Origin(Origin::Igp)),
                Some(1) => Ok(PathAttribute::Origin(Origin::Egp)),
                Some(2) => Ok(PathAttribute::Origin(Origin::Incomplete)),
                v => Err(withdraw(
                    UpdateSubcode::InvalidOriginAttribute,
                    format!("ORIGIN value {v:?} undefined"),
                )),
            }
        }
        2 => decode_as_path(value, opts.four_octet_as)
            .map(PathAttribute::AsPath)
            .map_err(|e| withdraw(UpdateSubcode::MalformedAsPath, e)),
        3 => {
            if value.len() != 4 {
                return Err(len_err("NEXT_HOP"));
            }
            let nh = r.ipv4().ok_or_else(|| len_err("NEXT_HOP"))?;
            if nh.is_unspecified() || nh.is_multicast() || nh.is_broadcast() {
                return Err(withdraw(
                    UpdateSubcode::InvalidNextHopAttribute,
                    format!("NEXT_HOP {nh} is not a unicast address"),
                ));
            }
            Ok(PathAttribute::NextHop(nh))
        }
        4 | 5 => {
            let name = if typ == 4 {
                "MULTI_EXIT_DISC"
            } else {
                "LOCAL_PREF"
            };
            if value.len() != 4 {
                return Err(len_err(name));
            }
            let v = r.u32().ok_or_else(|| len_err(name))?;
            Ok(if typ == 4 {
                PathAttribute::MultiExitDisc(v)
            } else {
                PathAttribute::LocalPref(v)
            })
        }
        6 => {
            if !value.is_empty() {
                return Err(AttrError::Discard);
            }
            Ok(PathAttribute::AtomicAggregate)
        }
        7 => {
            let asn = if opts.four_octet_as {
                if value.len() != 8 {
                    return Err(AttrError::Discard);
                }
                r.u32()
            } else {
                if value.len() != 6 {
                    return Err(AttrError::Discard);
                }
                r.u16().map(u32::from)
            };
            match (asn, r.ipv4()) {
                (Some(asn), Some(address)) => Ok(PathAttribute::Aggregator { asn, address }),
                _ => Err(AttrError::Discard),
            }
        }
        8 => {
            if value.is_empty() || !value.len().is_multiple_of(4) {
                return Err(len_err("COMMUNITIES"));
            }
            let mut c = Vec::with_capacity(value.len() / 4);
            while let Some(v) = r.u32() {
                c.push(v);
            }
            Ok(PathAttribute::Communities(c))
        }
        9 => {
            if value.len() != 4 {
                return Err(len_err("ORIGINATOR_ID"));
            }
            let id = r.ipv4().ok_or_else(|| len_err("ORIGINATOR_ID"))?;
            Ok(PathAttribute::OriginatorId(id))
        }
        10 => {
            if value.is_empty() || !value.len().is_multiple_of(4) {
                return Err(len_err("CLUSTER_LIST"));
            }
            let mut c = Vec::with_capacity(value.len() / 4);
            while let Some(v) = r.ipv4() {
                c.push(v);
            }
            Ok(PathAttribute::ClusterList(c))
        }
        14 => decode_mp_reach(value)
            .map(PathAttribute::MpReach)
            .map_err(|e| reset(UpdateSubcode::OptionalAttributeError, e)),
        _ => decode_mp_unreach(value)
            .map(PathAttribute::MpUnreach)
            .map_err(|e| reset(UpdateSubcode::OptionalAttributeError, e)),
    }
}

fn decode_as_path(value: &[u8], four_octet: bool) -> Result<Vec<AsSegment>, String> {
    let mut r = Reader::new(value);
    let mut segs = Vec::new();
    while !r.is_empty() {
        let kind = match r.u8() {
            Some(1) => SegmentType::AsSet,
            Some(2) => SegmentType::AsSequence,
            t => return Err(format!("AS_PATH segment type {t:?} unknown")),
        };
        let count = r
            .u8()
            .ok_or_else(|| "AS_PATH segment truncated".to_string())?;
        if count == 0 {
            return Err("AS_PATH segment with zero length".into());
        }
        let mut asns = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let asn = if four_octet {
                r.u32()
            } else {
                r.u16().map(u32::from)
            };
            asns.push(asn.ok_or_else(|| "AS_PATH segment overruns the attribute".to_string())?);
        }
        segs.push(AsSegment { kind, asns });
    }
    Ok(segs)
}

fn decode_family(r: &mut Reader<'_>) -> Result<Family, String> {
    let (Some(afi), Some(safi)) = (r.u16(), r.u8()) else {
        return Err("AFI/SAFI truncated".into());
    };
    let family = Family { afi, safi };
    if !family.is_supported() {
        return Err(format!("unsupported AFI {afi} SAFI {safi}"));
    }
    Ok(family)
}

fn decode_mp_reach(value: &[u8]) -> Result<MpReach, String> {
    let mut r = Reader::new(value);
    let family = decode_family(&mut r)?;
    let nh_len = r
        .u8()
        .ok_or_else(|| "MP_REACH_NLRI truncated".to_string())?;
    let nh = r
        .take(usize::from(nh_len))
        .ok_or_else(|| "MP_REACH_NLRI next hop truncated".to_string())?;
    let mut nr = Reader::new(nh);
    let next_hops: Vec<IpAddr> = match nh_len {
        4 => nr.ipv4().map(IpAddr::V4).into_iter().collect(),
        16 => nr.ipv6().map(IpAddr::V6).into_iter().collect(),
        32 => [nr.ipv6(), nr.ipv6()]
            .into_iter()
            .flatten()
            .map(IpAddr::V6)
            .collect(),
        n => return Err(format!("MP_REACH_NLRI next hop length {n} unsupported")),
    };
    let _reserved = r
        .u8()
        .ok_or_else(|| "MP_REACH_NLRI reserved octet missing".to_string())?;
    let nlri = parse_prefixes(r.rest(), family == Family::IPV6_UNICAST)?;
    Ok(MpReach {
        family,
        next_hops,
        nlri,
    })
}

fn decode_mp_unreach(value: &[u8]) -> Result<MpUnreach, String> {
    let mut r = Reader::new(value);
    let family = decode_family(&mut r)?;
    let withdrawn = parse_prefixes(r.rest(), family == Family::IPV6_UNICAST)?;
    Ok(MpUnreach { family, withdrawn })
}
