"""Easy built-in Code-v0 problems (written for llm-zoo)."""

from code_problems.common import array_input, line, rng, spec

_r = rng(101)

PROBLEMS = [
    spec(
        "even-sum",
        "Sum of Even Numbers",
        "easy",
        """
        You are given n integers. Print the sum of those that are even (negative numbers can be even too).

        Input
        The first line contains n (1 <= n <= 10^5). The second line contains n integers a_1 ... a_n
        (-10^9 <= a_i <= 10^9).

        Output
        Print one integer: the sum of all even a_i, or 0 if there are none.

        Example
        Input:
        5
        1 2 3 4 -6
        Output:
        0
        """,
        """
        import sys
        data = sys.stdin.read().split()
        n = int(data[0])
        print(sum(x for x in map(int, data[1:1 + n]) if x % 2 == 0))
        """,
        [
            "5\n1 2 3 4 -6\n",
            "3\n1 3 5\n",
            "1\n8\n",
            "4\n-2 -4 7 10\n",
            "6\n1000000000 999999999 -1000000000 2 2 0\n",
            array_input(_r.randint(-(10**9), 10**9) for _ in range(2000)),
        ],
    ),
    spec(
        "spread",
        "Spread of a List",
        "easy",
        """
        The spread of a list of numbers is its largest element minus its smallest element.
        Print the spread of the given list.

        Input
        The first line contains n (1 <= n <= 10^5). The second line contains n integers
        (-10^9 <= a_i <= 10^9).

        Output
        Print the spread.

        Example
        Input:
        4
        3 -2 7 7
        Output:
        9
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        values = data[1:1 + data[0]]
        print(max(values) - min(values))
        """,
        [
            "4\n3 -2 7 7\n",
            "1\n42\n",
            "3\n-5 -5 -5\n",
            "2\n-1000000000 1000000000\n",
            "5\n10 9 8 7 6\n",
            array_input(_r.randint(-(10**6), 10**6) for _ in range(3000)),
        ],
    ),
    spec(
        "count-vowels",
        "Counting Vowels",
        "easy",
        """
        Count the vowels in a line of text. The vowels are a, e, i, o and u, in upper or lower case
        (y is not a vowel).

        Input
        One line of at most 10^5 printable ASCII characters (it may contain spaces and punctuation).

        Output
        Print the number of vowels in the line.

        Example
        Input:
        Hello, World!
        Output:
        3
        """,
        """
        line = input()
        print(sum(ch in "aeiouAEIOU" for ch in line))
        """,
        [
            "Hello, World!\n",
            "rhythm myths by crypts\n",
            "AEIOU aeiou\n",
            "Queueing is unusual; EUOUAE!\n",
            "x\n",
            "The quick brown fox jumps over the lazy dog " * 50 + "\n",
        ],
    ),
    spec(
        "ping-pong",
        "Ping and Pong",
        "easy",
        """
        Count from 1 to n. For each number i print one line: "PingPong" if i is divisible by both a
        and b, otherwise "Ping" if i is divisible by a, otherwise "Pong" if i is divisible by b,
        otherwise the number i itself.

        Input
        One line with three integers n, a, b (1 <= n <= 10^4, 1 <= a, b <= 100).

        Output
        n lines as described.

        Example
        Input:
        6 2 3
        Output:
        1
        Ping
        Pong
        Ping
        5
        PingPong
        """,
        """
        n, a, b = map(int, input().split())
        out = []
        for i in range(1, n + 1):
            if i % a == 0 and i % b == 0:
                out.append("PingPong")
            elif i % a == 0:
                out.append("Ping")
            elif i % b == 0:
                out.append("Pong")
            else:
                out.append(str(i))
        print("\\n".join(out))
        """,
        ["6 2 3\n", "1 1 1\n", "10 4 4\n", "15 5 3\n", "30 7 100\n", "200 6 4\n"],
    ),
    spec(
        "reverse-words",
        "Words Backwards",
        "easy",
        """
        Print the words of a sentence in reverse order. Words are maximal runs of non-space
        characters; the words may be separated by several spaces and the line may start or end with
        spaces.

        Input
        One line of at most 10^5 characters containing at least one word.

        Output
        The words in reverse order, separated by single spaces.

        Example
        Input:
        the sky  is blue
        Output:
        blue is sky the
        """,
        """
        print(" ".join(reversed(input().split())))
        """,
        [
            "the sky  is blue\n",
            "single\n",
            "   leading and trailing   \n",
            "a b c d e f g\n",
            "Hello, world! 123 ok?\n",
            line(f"w{i}" for i in range(500)) + "\n",
        ],
    ),
    spec(
        "digital-root",
        "Digital Root",
        "easy",
        """
        Replace a non-negative integer by the sum of its decimal digits, again and again, until a
        single digit remains. Print that digit (the digital root).

        Input
        One line with a non-negative integer N without leading zeros, having at most 10^5 digits.

        Output
        Print the digital root of N.

        Example
        Input:
        9875
        Output:
        2
        """,
        """
        s = input().strip()
        total = sum(int(ch) for ch in s)
        print(0 if total == 0 else 1 + (total - 1) % 9)
        """,
        [
            "9875\n",
            "0\n",
            "9\n",
            "10\n",
            "999999999999999999999999\n",
            "".join(str(_r.randint(1 if i == 0 else 0, 9)) for i in range(50000)) + "\n",
        ],
    ),
    spec(
        "second-largest",
        "Runner-up Value",
        "easy",
        """
        Find the second largest distinct value in a list: the largest value that is strictly
        smaller than the maximum.

        Input
        The first line contains n (1 <= n <= 10^5). The second line contains n integers
        (-10^9 <= a_i <= 10^9).

        Output
        Print the second largest distinct value, or NONE if all values are equal.

        Example
        Input:
        5
        4 9 9 2 7
        Output:
        7
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        values = set(data[1:1 + data[0]])
        if len(values) < 2:
            print("NONE")
        else:
            values.remove(max(values))
            print(max(values))
        """,
        [
            "5\n4 9 9 2 7\n",
            "3\n5 5 5\n",
            "1\n-3\n",
            "2\n-10 -20\n",
            "6\n1 2 3 3 3 3\n",
            array_input(_r.randint(-1000, 1000) for _ in range(5000)),
        ],
    ),
    spec(
        "palindrome-phrase",
        "Palindromic Phrase",
        "easy",
        """
        A phrase is a palindrome if, after removing every character that is not a letter or a digit
        and ignoring case, it reads the same forwards and backwards. A phrase with no letters or
        digits counts as a palindrome.

        Input
        One line of at most 10^5 printable ASCII characters.

        Output
        Print YES if the phrase is a palindrome, otherwise NO.

        Example
        Input:
        Never odd or even.
        Output:
        YES
        """,
        """
        s = [ch.lower() for ch in input() if ch.isalnum()]
        print("YES" if s == s[::-1] else "NO")
        """,
        [
            "Never odd or even.\n",
            "Hello\n",
            "!!! ???\n",
            "No 'x' in Nixon\n",
            "12321 1\n",
            "ab" * 3000 + "a\n",
            "ab" * 3000 + "b\n",
        ],
    ),
    spec(
        "mean-value",
        "Average",
        "easy",
        """
        Compute the arithmetic mean of n real numbers.

        Input
        The first line contains n (1 <= n <= 10^5). The second line contains n real numbers, each
        with absolute value at most 10^6 and at most 3 digits after the decimal point.

        Output
        Print the mean. An answer within 10^-6 of the correct one (absolute or relative) is accepted.

        Example
        Input:
        3
        1 2 4.5
        Output:
        2.5
        """,
        """
        import sys
        data = sys.stdin.read().split()
        n = int(data[0])
        print("%.9f" % (sum(float(x) for x in data[1:1 + n]) / n))
        """,
        [
            "3\n1 2 4.5\n",
            "1\n-7.125\n",
            "4\n0 0 0 0\n",
            "2\n1000000 -999999.999\n",
            "5\n0.001 0.002 0.003 0.004 0.005\n",
            array_input(f"{_r.uniform(-(10**6), 10**6):.3f}" for _ in range(1000)),
        ],
    ),
    spec(
        "run-length",
        "Run-Length Encoding",
        "easy",
        """
        Compress a string of lowercase letters: replace every maximal run of equal letters by the
        letter followed by the length of the run.

        Input
        One line with a non-empty string of at most 10^5 lowercase letters.

        Output
        Print the encoded string.

        Example
        Input:
        aaabccddd
        Output:
        a3b1c2d3
        """,
        """
        s = input().strip()
        out = []
        i = 0
        while i < len(s):
            j = i
            while j < len(s) and s[j] == s[i]:
                j += 1
            out.append(s[i] + str(j - i))
            i = j
        print("".join(out))
        """,
        [
            "aaabccddd\n",
            "a\n",
            "abcdef\n",
            "zzzzzzzzzzzz\n",
            "aabbaa\n",
            "".join(_r.choice("ab") * _r.randint(1, 15) for _ in range(2000)) + "\n",
        ],
    ),
    spec(
        "leap-years",
        "Counting Leap Years",
        "easy",
        """
        In the Gregorian calendar a year is a leap year if it is divisible by 4, except years
        divisible by 100, which are leap years only if they are also divisible by 400. Count the
        leap years from year a to year b inclusive.

        Input
        One line with two integers a and b (1 <= a <= b <= 10^9).

        Output
        Print the number of leap years y with a <= y <= b.

        Example
        Input:
        1896 1904
        Output:
        2
        """,
        """
        a, b = map(int, input().split())
        def upto(y):
            return y // 4 - y // 100 + y // 400
        print(upto(b) - upto(a - 1))
        """,
        ["1896 1904\n", "2000 2000\n", "1900 1900\n", "1 3\n", "1 1000000000\n", "123456 7654321\n"],
    ),
    spec(
        "transpose",
        "Matrix Transpose",
        "easy",
        """
        Print the transpose of an r x c matrix of integers (row i of the result is column i of the
        input).

        Input
        The first line contains r and c (1 <= r, c <= 300). Each of the next r lines contains c
        integers with absolute value at most 10^9.

        Output
        Print c lines with r integers each, separated by spaces.

        Example
        Input:
        2 3
        1 2 3
        4 5 6
        Output:
        1 4
        2 5
        3 6
        """,
        """
        import sys
        data = sys.stdin.read().split()
        r, c = int(data[0]), int(data[1])
        rows = [data[2 + i * c: 2 + (i + 1) * c] for i in range(r)]
        print("\\n".join(" ".join(row[j] for row in rows) for j in range(c)))
        """,
        [
            "2 3\n1 2 3\n4 5 6\n",
            "1 1\n-5\n",
            "1 4\n1 2 3 4\n",
            "3 1\n7\n8\n9\n",
            "2 2\n1000000000 -1000000000\n0 1\n",
            "30 20\n" + "".join(line(_r.randint(-99, 99) for _ in range(20)) + "\n" for _ in range(30)),
        ],
    ),
    spec(
        "distinct-count",
        "Distinct Values",
        "easy",
        """
        How many different values appear in a list of n integers?

        Input
        The first line contains n (1 <= n <= 2 * 10^5). The second line contains n integers
        (-10^9 <= a_i <= 10^9).

        Output
        Print the number of distinct values.

        Example
        Input:
        6
        3 1 3 2 1 3
        Output:
        3
        """,
        """
        import sys
        data = sys.stdin.read().split()
        print(len(set(data[1:1 + int(data[0])])))
        """,
        [
            "6\n3 1 3 2 1 3\n",
            "1\n0\n",
            "4\n-1 1 -1 1\n",
            "5\n5 4 3 2 1\n",
            "3\n7 7 7\n",
            array_input(_r.randint(1, 500) for _ in range(10000)),
        ],
    ),
    spec(
        "grade-count",
        "Grade Distribution",
        "easy",
        """
        Exam scores are integers from 0 to 100. A score of at least 90 earns grade A, at least 80
        grade B, at least 70 grade C, at least 60 grade D, anything lower grade F. Count how many
        students got each grade.

        Input
        The first line contains n (1 <= n <= 10^5). The second line contains n scores.

        Output
        Print five lines, for grades A, B, C, D, F in this order: the grade letter, a space, and the
        number of students with that grade.

        Example
        Input:
        5
        95 80 79 59 60
        Output:
        A 1
        B 1
        C 1
        D 1
        F 1
        """,
        """
        import sys
        data = list(map(int, sys.stdin.read().split()))
        counts = dict.fromkeys("ABCDF", 0)
        for s in data[1:1 + data[0]]:
            grade = "A" if s >= 90 else "B" if s >= 80 else "C" if s >= 70 else "D" if s >= 60 else "F"
            counts[grade] += 1
        print("\\n".join(f"{g} {c}" for g, c in counts.items()))
        """,
        [
            "5\n95 80 79 59 60\n",
            "1\n100\n",
            "3\n0 0 0\n",
            "6\n90 89 70 69 61 59\n",
            "4\n100 90 80 70\n",
            array_input(_r.randint(0, 100) for _ in range(3000)),
        ],
    ),
    spec(
        "clock-angle",
        "Angle Between the Hands",
        "easy",
        """
        An analog clock shows the time HH:MM. The hour hand moves continuously (it advances 0.5
        degrees per minute). Print the smaller of the two angles between the hour and the minute
        hand, in degrees.

        Input
        One line with the time as HH:MM (00 <= HH <= 23, 00 <= MM <= 59). Hours 12-23 are shown as
        0-11 on the dial.

        Output
        Print the angle (between 0 and 180 inclusive). An answer within 10^-6 is accepted.

        Example
        Input:
        03:30
        Output:
        75
        """,
        """
        hh, mm = map(int, input().strip().split(":"))
        hour = (hh % 12) * 30 + mm * 0.5
        minute = mm * 6
        diff = abs(hour - minute)
        print(min(diff, 360 - diff))
        """,
        ["03:30\n", "00:00\n", "12:00\n", "06:00\n", "09:45\n", "23:59\n", "15:17\n"],
    ),
]
