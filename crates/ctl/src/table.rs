//! Output tables. [`BoxTable`] draws calicoctl's boxed tables (`ipam show`); [`plain`] prints
//! the whitespace-aligned columns of `get`.

/// Horizontal alignment of a column's body cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table drawn with `+---+` borders and `|` separators; header cells are centred.
#[derive(Debug, Clone, Default)]
pub struct BoxTable {
    headers: Vec<String>,
    aligns: Vec<Align>,
    rows: Vec<Vec<String>>,
}

fn width(s: &str) -> usize {
    s.chars().count()
}

impl BoxTable {
    /// A table with the given columns: (header, alignment of body cells).
    pub fn new(columns: &[(&str, Align)]) -> BoxTable {
        BoxTable {
            headers: columns.iter().map(|(h, _)| h.to_string()).collect(),
            aligns: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells are empty.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, every line ending in `\n`.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|i| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|c| width(c))
                    .chain([width(&self.headers[i])])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let border = {
            let mut s = String::from("+");
            for w in &widths {
                s.push_str(&"-".repeat(w + 2));
                s.push('+');
            }
            s.push('\n');
            s
        };
        let line = |cells: Vec<String>| {
            let mut s = String::from("|");
            for c in cells {
                s.push(' ');
                s.push_str(&c);
                s.push_str(" |");
            }
            s.push('\n');
            s
        };
        let mut out = border.clone();
        out.push_str(&line(
            self.headers
                .iter()
                .zip(&widths)
                .map(|(h, w)| {
                    let gap = w - width(h);
                    // Extra space goes to the right, as Go's tablewriter centres.
                    format!("{}{h}{}", " ".repeat(gap / 2), " ".repeat(gap - gap / 2))
                })
                .collect(),
        ));
        out.push_str(&border);
        for r in &self.rows {
            out.push_str(&line(
                widths
                    .iter()
                    .enumerate()
                    .map(|(i, w)| {
                        let c = r.get(i).map(String::as_str).unwrap_or("");
                        match self.aligns[i] {
                            Align::Left => format!("{c:<w$}"),
                            Align::Right => format!("{c:>w$}"),
                        }
                    })
                    .collect(),
            ));
        }
        if !self.rows.is_empty() {
            out.push_str(&border);
        }
        out
    }
}

/// Whitespace-aligned columns (header row first), three spaces apart, as `calicoctl get`
/// prints them. Trailing spaces are trimmed.
pub fn plain(headers: &[&str], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| width(c))
                .chain([width(headers[i])])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let fmt_row = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 < n {
                s.push_str(&format!("{c:<w$}   ", w = widths[i]));
            } else {
                s.push_str(c);
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = fmt_row(headers.to_vec());
    for r in rows {
        out.push_str(&fmt_row(
            (0..n)
                .map(|i| r.get(i).map(String::as_str).unwrap_or(""))
                .collect(),
        ));
    }
    out
}

/// `part` as a percentage of `whole`, rounded to an integer the way Go's `%.0f` rounds
/// (half to even), computed exactly in integers. 0 when `whole` is 0.
pub fn percent(part: u128, whole: u128) -> u128 {
    if whole == 0 {
        return 0;
    }
    let num = part * 100;
    let q = num / whole;
    let r = num % whole;
    match (2 * r).cmp(&whole) {
        std::cmp::Ordering::Less => q,
        std::cmp::Ordering::Greater => q + 1,
        std::cmp::Ordering::Equal => q + (q % 2),
    }
}

/// `N (P%)`, the cell format of `ipam show`.
pub fn count_with_percent(part: u128, whole: u128) -> String {
    format!("{part} ({}%)", percent(part, whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_rounds_half_to_even_like_go() {
        assert_eq!(percent(24, 64), 38); // 37.5 -> 38
        assert_eq!(percent(40, 64), 62); // 62.5 -> 62
        assert_eq!(percent(61, 65536), 0);
        assert_eq!(percent(65475, 65536), 100); // 99.907 -> 100
        assert_eq!(percent(1, 8), 12); // 12.5 -> 12
        assert_eq!(percent(3, 8), 38); // 37.5 -> 38
        assert_eq!(percent(1, 3), 33);
        assert_eq!(percent(2, 3), 67);
        assert_eq!(percent(0, 0), 0);
        assert_eq!(percent(64, 64), 100);
    }

    #[test]
    fn empty_box_table_has_header_only() {
        let t = BoxTable::new(&[("A", Align::Left), ("LONGER", Align::Right)]);
        assert_eq!(
            t.render(),
            "+---+--------+\n| A | LONGER |\n+---+--------+\n"
        );
    }

    #[test]
    fn plain_columns_align() {
        let out = plain(
            &["NAME", "CIDR", "SELECTOR"],
            &[
                vec![
                    "default-ipv4-ippool".into(),
                    "10.244.0.0/16".into(),
                    "all()".into(),
                ],
                vec!["p2".into(), "10.9.0.0/24".into(), "all()".into()],
            ],
        );
        assert_eq!(
            out,
            "NAME                  CIDR            SELECTOR\n\
             default-ipv4-ippool   10.244.0.0/16   all()\n\
             p2                    10.9.0.0/24     all()\n"
        );
    }
}
