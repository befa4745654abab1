#![forbid(unsafe_code)]

fn main() {
    tern_plugin::main(tern_plugin::Plugin::Tern)
}
