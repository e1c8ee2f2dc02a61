// Embedded Swift writes a value it has no description for (an enum without one, a Duration) as
// "(cannot print value in embedded Swift)": in a log line or an answer's detail, text the user
// cannot read, where the full build wrote the value. scripts/firmware compiles this file into
// every module the firmware links, so this overload is seen by every file of them; it is chosen
// exactly for such values, and its deprecation is the warning scripts/firmware fails on. Give
// the type a `CustomStringConvertible` description, or write the value out
// (`Duration.secondsDescription`). It writes what Embedded Swift would, so a run that got past
// the build still shows it (scripts/firmware-proof and the VM's unit test look for the text).
#if $Embedded
extension DefaultStringInterpolation {
    @available(*, deprecated, message: "Embedded Swift cannot print this value")
    mutating func appendInterpolation<T>(_ value: T) {
        appendLiteral("(cannot print value in embedded Swift)")
    }
}
#endif
