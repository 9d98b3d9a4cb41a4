//! `wat2wasm IN.wat OUT.wasm`: the hand-written guests of nginx-compat/tests (no wabt needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(input), Some(output)) = (args.get(1), args.get(2)) else {
        return Err("usage: wat2wasm IN.wat OUT.wasm".into());
    };
    std::fs::write(output, wat::parse_file(input)?)?;
    Ok(())
}
