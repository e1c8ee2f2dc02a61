// Embedded Swift writes a value it has no description for (an enum without one, a Duration) as
// "(cannot print value in embedded Swift)": in a log line or an answer's detail, text the user
// cannot read, where the full build wrote the value. This overload is chosen exactly there, in
// the firmware build only, and its deprecation is the warning scripts/firmware fails on: give
// the type a `CustomStringConvertible` description, or write the value out
// (`Duration.secondsDescription`). Nothing calls it in a firmware that builds.
#if $Embedded
extension DefaultStringInterpolation {
    @available(*, deprecated, message: "Embedded Swift cannot print this value")
    public mutating func appendInterpolation<T>(_ value: T) {}
}
#endif
