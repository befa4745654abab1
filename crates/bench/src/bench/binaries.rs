//! The measured binaries: their stripped size and how they are linked (read from the ELF program
//! headers).

use std::fmt;
use std::path::Path;

use super::error::{BenchError, io_err, run};

/// The size of `binary` once stripped: a copy in `scratch` is stripped with `strip`, so debug
/// builds give the same figure as the release profile (`strip = "symbols"`).
pub fn stripped_size(binary: &Path, scratch: &Path) -> Result<u64, BenchError> {
    let name = binary
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "binary".into());
    let copy = scratch.join(format!("{name}.stripped"));
    std::fs::copy(binary, &copy).map_err(io_err(format!(
        "copy {} to {}",
        binary.display(),
        copy.display()
    )))?;
    let result = run("strip", &[&copy.to_string_lossy()]).and_then(|()| {
        Ok(std::fs::metadata(&copy)
            .map_err(io_err(format!("stat {}", copy.display())))?
            .len())
    });
    let _ = std::fs::remove_file(&copy);
    result
}

/// The stripped size of one binary, or why it could not be measured.
#[derive(Debug, Clone)]
pub struct BinarySize {
    /// Binary name.
    pub name: String,
    /// Stripped size in bytes, or the error.
    pub bytes: Result<u64, String>,
    /// How it is linked, or why that could not be read.
    pub linkage: Result<Linkage, String>,
}

/// How an ELF executable is linked, as the kernel sees it when it execs the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linkage {
    /// No `PT_INTERP`: the kernel jumps straight to the binary (static or static-pie), no
    /// dynamic loader and no shared library is mapped.
    Static,
    /// `PT_INTERP` names the dynamic loader (e.g. `/lib64/ld-linux-x86-64.so.2`), which maps
    /// and relocates the shared libraries before `main`.
    Dynamic {
        /// The loader `PT_INTERP` names.
        interpreter: String,
    },
}

impl fmt::Display for Linkage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Linkage::Static => write!(f, "static"),
            Linkage::Dynamic { interpreter } => write!(f, "dynamic ({interpreter})"),
        }
    }
}

/// The `PT_INTERP` program header type.
const PT_INTERP: u32 = 3;

/// Reads how the ELF file `binary` is linked: [`Linkage::Dynamic`] when it has a `PT_INTERP`
/// program header, else [`Linkage::Static`]. 64-bit little-endian ELF only (every binary the
/// bench runs on x86_64 and aarch64 Linux); anything else is an error, never a guess.
pub fn elf_linkage(binary: &Path) -> Result<Linkage, BenchError> {
    let bytes = std::fs::read(binary).map_err(io_err(format!("read {}", binary.display())))?;
    parse_elf_linkage(&bytes).map_err(|why| BenchError::Io {
        context: format!("read the ELF header of {}", binary.display()),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    })
}

/// [`elf_linkage`] on the file's bytes; the error says which field is wrong.
pub fn parse_elf_linkage(bytes: &[u8]) -> Result<Linkage, String> {
    let field = |off: usize, len: usize| -> Result<&[u8], String> {
        off.checked_add(len)
            .and_then(|end| bytes.get(off..end))
            .ok_or_else(|| format!("truncated: {len} bytes at offset {off} past the end"))
    };
    let u16_at = |off| field(off, 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |off| field(off, 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    let u64_at = |off| field(off, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    if field(0, 4)? != b"\x7fELF" {
        return Err("not an ELF file (no \\x7fELF magic)".into());
    }
    // e_ident[EI_CLASS] = ELFCLASS64, e_ident[EI_DATA] = ELFDATA2LSB.
    if field(4, 2)? != [2, 1] {
        return Err("not a 64-bit little-endian ELF (EI_CLASS/EI_DATA)".into());
    }
    let to_usize = |v: u64, what: &str| {
        usize::try_from(v).map_err(|_| format!("{what} {v} does not fit in memory"))
    };
    let phoff = to_usize(u64_at(32)?, "e_phoff")?;
    let phentsize = usize::from(u16_at(54)?);
    let phnum = usize::from(u16_at(56)?);
    if phnum > 0 && phentsize < 56 {
        return Err(format!("e_phentsize {phentsize} < 56"));
    }
    for i in 0..phnum {
        let ph = i
            .checked_mul(phentsize)
            .and_then(|o| o.checked_add(phoff))
            .ok_or_else(|| format!("program header {i} offset overflows"))?;
        if u32_at(ph)? != PT_INTERP {
            continue;
        }
        let off = to_usize(u64_at(ph + 8)?, "PT_INTERP p_offset")?;
        let size = to_usize(u64_at(ph + 32)?, "PT_INTERP p_filesz")?;
        let raw = field(off, size)?;
        let name = raw.split(|b| *b == 0).next().unwrap_or_default();
        return Ok(Linkage::Dynamic {
            interpreter: String::from_utf8_lossy(name).into_owned(),
        });
    }
    Ok(Linkage::Static)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal 64-bit little-endian ELF image: header, `phdrs` program headers of
    /// (type, offset, filesz), then `tail`.
    fn elf(phdrs: &[(u32, u64, u64)], tail: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // ELFDATA2LSB
        b[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[56..58].copy_from_slice(&(phdrs.len() as u16).to_le_bytes()); // e_phnum
        for (ty, off, size) in phdrs {
            let mut ph = vec![0u8; 56];
            ph[..4].copy_from_slice(&ty.to_le_bytes());
            ph[8..16].copy_from_slice(&off.to_le_bytes());
            ph[32..40].copy_from_slice(&size.to_le_bytes());
            b.extend(ph);
        }
        b.extend(tail);
        b
    }

    #[test]
    fn elf_linkage_reads_pt_interp() {
        // PT_LOAD (1) only: static (or static-pie).
        assert_eq!(
            parse_elf_linkage(&elf(&[(1, 0, 0)], &[])),
            Ok(Linkage::Static)
        );
        // PT_PHDR (6), PT_INTERP (3) pointing at the NUL-terminated loader path after them.
        let loader = b"/lib64/ld-linux-x86-64.so.2\0";
        let at = 64 + 2 * 56;
        let img = elf(&[(6, 64, 112), (3, at, loader.len() as u64)], loader);
        let dynamic = Linkage::Dynamic {
            interpreter: "/lib64/ld-linux-x86-64.so.2".into(),
        };
        assert_eq!(parse_elf_linkage(&img), Ok(dynamic.clone()));
        assert_eq!(dynamic.to_string(), "dynamic (/lib64/ld-linux-x86-64.so.2)");
        // Bad input is an error naming what is wrong, never a panic or a guess.
        let err = |b: &[u8]| parse_elf_linkage(b).unwrap_err();
        assert!(err(b"#!/bin/sh\n").contains("not an ELF"));
        assert!(err(b"\x7fEL").contains("truncated"));
        let mut be = elf(&[], &[]);
        be[5] = 2;
        assert!(err(&be).contains("64-bit little-endian"));
        // An interpreter past the end of the file, and offsets that overflow.
        assert!(err(&elf(&[(3, 10_000, 30)], &[])).contains("truncated"));
        assert!(err(&elf(&[(3, u64::MAX, 30)], &[])).contains("truncated"));
        let mut far = elf(&[(1, 0, 0)], &[]);
        far[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse_elf_linkage(&far).is_err());
        // This test binary: cargo links it dynamically unless crt-static is set.
        let me = elf_linkage(&std::env::current_exe().unwrap()).unwrap();
        if cfg!(target_feature = "crt-static") {
            assert_eq!(me, Linkage::Static);
        } else {
            assert!(matches!(me, Linkage::Dynamic { .. }), "{me}");
        }
    }

    #[test]
    fn stripping_a_copy_leaves_the_original_alone() {
        let scratch = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let before = std::fs::metadata(&exe).unwrap().len();
        let stripped = stripped_size(&exe, scratch.path()).unwrap();
        assert!(stripped > 0 && stripped < before, "{stripped} vs {before}");
        assert_eq!(std::fs::metadata(&exe).unwrap().len(), before);
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    }
}
