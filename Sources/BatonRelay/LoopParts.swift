// The relays are parts of the gateway's loop (docs/architecture.md "The loop"): each polls its
// links' descriptors and has a next deadline.
public import BatonLibc

extension FetchRelay: LoopPart {}
extension StreamRelay: LoopPart {}
extension ContinuingLinks: LoopPart {}
